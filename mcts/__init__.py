"""mcts."""
