"""dataengine."""
