"""Simulations per second of the batched mcts core against plain Python, one tree at a time.

Both search the same synthetic environment (mcts.synthetic.SyntheticEnv, re-implemented on
Python ints for the baseline and checked equal) with the same PUCT rule, min-max normalised Q
and mctx backup. The batched core runs B trees at once; the baseline runs them one by one, so
its rate does not depend on B. Prints one line per configuration with the ratio.

    .venv/bin/python benchmarks/bench_mcts.py            # B in {1, 64, 1024}, 64 simulations
    .venv/bin/python benchmarks/bench_mcts.py --quick    # tiny run
    .venv/bin/python benchmarks/bench_mcts.py --device cuda
    .venv/bin/python benchmarks/bench_mcts.py --compiled   # adds torch.compile lines (minutes to compile)
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import time

import torch

import mcts
from mcts.synthetic import _CORRECT_BIT, _DEPTH_SHIFT, _HASH_MASK, _UNIT_BITS, SyntheticEnv, _mix

PB_C_INIT, PB_C_BASE = 1.25, 19652.0
# On CPU the process's CPU time is the clock: the host is shared, and wall time there measures
# other people's jobs. On CUDA, wall time (the GPU works while the process waits).
CLOCK = time.process_time


def _unit(h: int, salt: int) -> float:
    return (_mix(h + salt) & ((1 << _UNIT_BITS) - 1)) * 2.0**-_UNIT_BITS


class ScalarEnv:
    """SyntheticEnv on Python ints: the baseline's expand function, one node at a time."""

    def __init__(self, env: SyntheticEnv):
        self.env = env
        self.k = env.num_actions

    def correct_action(self, depth: int) -> int:
        return _mix(depth + 1000 * (self.env.seed + 1)) % self.k

    def node(self, handle: int) -> tuple[list[float], float]:
        depth = handle >> _DEPTH_SHIFT
        correct = (handle & _CORRECT_BIT) != 0
        h = handle & _HASH_MASK
        best = self.correct_action(depth)
        logits = []
        for a in range(self.k):
            hk = h * (self.k + 1) + a
            logit = 2.0 * _unit(hk, 1) - 1.0 + (self.env.prior_hint if a == best else 0.0)
            missing = _unit(hk, 2) < self.env.invalid_fraction and a != best
            logits.append(-math.inf if missing else logit)
        return logits, 0.4 * _unit(h, 3) + 0.4 * float(correct)

    def expand(self, parent: int, action: int) -> tuple[float, float, list[float], float, int, bool]:
        depth = (parent >> _DEPTH_SHIFT) + 1
        on_path = (parent & _CORRECT_BIT) != 0 and action == self.correct_action(depth - 1)
        h = _mix((parent & _HASH_MASK) * (self.k + 1) + action + 1)
        handle = (depth << _DEPTH_SHIFT) | (_CORRECT_BIT if on_path else 0) | h
        logits, value = self.node(handle)
        terminal = depth >= self.env.depth
        reward = 1.0 if terminal and on_path else 0.0
        return reward, (0.0 if terminal else self.env.discount), logits, (0.0 if terminal else value), handle, terminal


class PythonTree:
    """One search tree as Python lists (the baseline): the same statistics as mcts.Tree."""

    def __init__(self, logits: list[float], value: float, handle: int, k: int):
        self.k = k
        self.visits, self.value, self.raw, self.handle, self.terminal = [1], [value], [value], [handle], [False]
        self.logits, self.parent, self.action = [logits], [-1], [-1]
        self.child = [[-1] * k]
        self.n = [[0] * k]
        self.r = [[0.0] * k]
        self.d = [[0.0] * k]
        self.cv = [[0.0] * k]

    def select(self, s: int) -> int:
        q = [self.r[s][a] + self.d[s][a] * self.cv[s][a] for a in range(self.k)]
        visited = [q[a] for a in range(self.k) if self.n[s][a] > 0]
        lo, hi = min([self.value[s]] + visited), max([self.value[s]] + visited)
        finite = [x for x in self.logits[s] if x != -math.inf]
        top = max(finite)
        z = sum(math.exp(x - top) for x in finite)
        pb_c = PB_C_INIT + math.log((self.visits[s] + PB_C_BASE + 1) / PB_C_BASE)
        best, best_score = -1, -math.inf
        for a in range(self.k):
            if self.logits[s][a] == -math.inf:
                continue
            qn = ((q[a] if self.n[s][a] > 0 else lo) - lo) / max(hi - lo, 1e-8)
            p = math.exp(self.logits[s][a] - top) / z
            score = qn + math.sqrt(self.visits[s]) * pb_c * p / (self.n[s][a] + 1)
            if score > best_score:
                best, best_score = a, score
        return best

    def simulate(self, env: ScalarEnv) -> None:
        s = 0
        while True:
            a = self.select(s)
            c = self.child[s][a]
            if c < 0:
                r, d, logits, v, h, term = env.expand(self.handle[s], a)
                if all(x == -math.inf for x in logits):
                    term, d, v = True, 0.0, 0.0
                c = len(self.visits)
                self.visits.append(1)
                self.value.append(v)
                self.raw.append(v)
                self.handle.append(h)
                self.terminal.append(term)
                self.logits.append(logits)
                self.parent.append(s)
                self.action.append(a)
                self.child.append([-1] * self.k)
                self.n.append([0] * self.k)
                self.r.append([0.0] * self.k)
                self.d.append([0.0] * self.k)
                self.cv.append([0.0] * self.k)
                self.child[s][a], self.r[s][a], self.d[s][a] = c, r, d
                break
            if self.terminal[c]:
                self.visits[c] += 1
                break
            s = c
        g = self.value[c]
        while c != 0:
            p, a = self.parent[c], self.action[c]
            g = self.r[p][a] + self.d[p][a] * g
            self.value[p] = (self.value[p] * self.visits[p] + g) / (self.visits[p] + 1)
            self.visits[p] += 1
            self.cv[p][a] = self.value[c]
            self.n[p][a] += 1
            c = p


def python_baseline(env: SyntheticEnv, num_trees: int, num_simulations: int) -> tuple[float, list[list[int]]]:
    """(simulations/s, root visit counts per tree) of the plain-Python search over num_trees trees."""
    scalar = ScalarEnv(env)
    root = env.root(num_trees)
    start = CLOCK()
    visits = []
    for b in range(num_trees):
        logits = [float(x) for x in root.prior_logits[b]]
        tree = PythonTree(logits, float(root.value[b]), int(root.handle[b]), env.num_actions)
        for _ in range(num_simulations):
            tree.simulate(scalar)
        visits.append(tree.n[0])
    elapsed = CLOCK() - start
    return num_trees * num_simulations / elapsed, visits


def batched(
    env: SyntheticEnv, policy, b: int, num_simulations: int, leaves: int, device: str, graphs: bool | None = None,
    split: bool = False,
    compiled: bool = False,
) -> tuple[float, torch.Tensor, float, float]:
    """(simulations/s, `[B, K]` root visit counts, warm-up seconds, mean node depth) of one
    batched search of b trees (after a warm-up, untimed in the rate).

    graphs: mcts.search's CUDA graphs (default: on for CUDA with L = 1); each search captures its
    own graphs, and that capture is inside the timed call. The environment's expand is graph-safe,
    so whole iterations are graphs; split=True hides that, so it runs eagerly between graphs.
    compiled: mcts.search's torch.compile path; its warm-up is a whole search of the same shape,
    so the timed call reuses the compiled code (the warm-up seconds are what compiling cost)."""
    kwargs = {"dirichlet_fraction": 0.0} if policy is mcts.muzero_policy else {}
    kwargs["graphs"] = graphs
    kwargs["compiled"] = compiled
    expand = (lambda p, a, v: env.expand(p, a, v)) if split else env.expand
    warm = (b, num_simulations) if compiled else (min(b, 2), 4)
    start = time.perf_counter()
    policy(env.root(warm[0], device=device), expand, num_simulations=warm[1], device=device, **kwargs)
    warm_seconds = time.perf_counter() - start
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    clock = time.perf_counter if device.startswith("cuda") else CLOCK
    start = clock()
    out = policy(
        env.root(b, device=device), expand, num_simulations=num_simulations,
        leaves_per_iteration=leaves, device=device, **kwargs,
    )
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elapsed = clock() - start
    tree = out.search_tree
    assert int(tree.num_simulations.min()) == num_simulations
    made = torch.arange(tree.max_nodes, device=tree.device) < tree.num_nodes.unsqueeze(-1)
    depth = float(tree.depth[made].float().mean())
    return b * num_simulations / elapsed, tree.children_visits[:, 0].cpu(), warm_seconds, depth


def mctx_rate(
    env: SyntheticEnv, b: int, num_simulations: int, gumbel: bool, repeats: int, device: str,
) -> tuple[float, float] | None:
    """(best of `repeats` simulations/s, mean node depth of its trees) of DeepMind's mctx (JAX,
    jit) on the same environment, or None without mctx.

    JAX runs on the same kind of device as ours (its GPU for cuda, else its CPU), timed by the same clock.
    The environment is SyntheticEnv's hash written in jax.numpy (int64, so x64 is switched on);
    the search is mctx's own muzero_policy (no root noise) or gumbel_muzero_policy. mctx has no
    terminal nodes and masks invalid actions at the root only, so its trees are not ours: the
    rate is compared, not the visit counts. Compile time is excluded (a warm-up call).
    """
    # One XLA thread, as torch gets one (--threads 1): set before jax first loads.
    os.environ.setdefault("XLA_FLAGS", f"--xla_cpu_multi_thread_eigen={'false' if torch.get_num_threads() == 1 else 'true'} "
                          f"intra_op_parallelism_threads={torch.get_num_threads()}")
    os.environ.setdefault("JAX_PLATFORMS", "cuda" if device.startswith("cuda") else "cpu")
    clock = time.perf_counter if device.startswith("cuda") else CLOCK
    try:
        import jax
        import jax.numpy as jnp
        import mctx
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)
    k = env.num_actions

    def unit(h, salt):
        return (_mix(h + salt) & ((1 << _UNIT_BITS) - 1)).astype(jnp.float32) * 2.0**-_UNIT_BITS

    def correct_action(depth):
        return _mix(depth + 1000 * (env.seed + 1)) % k

    def node_outputs(handle):
        depth = handle >> _DEPTH_SHIFT
        correct = (handle & _CORRECT_BIT) != 0
        h = handle & _HASH_MASK
        hk = h[:, None] * (k + 1) + jnp.arange(k)
        best = correct_action(depth)[:, None] == jnp.arange(k)
        logits = 2.0 * unit(hk, 1) - 1.0 + env.prior_hint * best
        missing = (unit(hk, 2) < env.invalid_fraction) & ~best
        return jnp.where(missing, -jnp.inf, logits), 0.4 * unit(h, 3) + 0.4 * correct

    def recurrent_fn(params, rng_key, action, parent):
        del params, rng_key
        depth = (parent >> _DEPTH_SHIFT) + 1
        on_path = ((parent & _CORRECT_BIT) != 0) & (action == correct_action(depth - 1))
        h = _mix((parent & _HASH_MASK) * (k + 1) + action + 1)
        handle = (depth << _DEPTH_SHIFT) | (on_path * _CORRECT_BIT) | h
        logits, value = node_outputs(handle)
        terminal = depth >= env.depth
        out = mctx.RecurrentFnOutput(
            reward=(terminal & on_path).astype(jnp.float32),
            discount=jnp.where(terminal, 0.0, env.discount).astype(jnp.float32),
            prior_logits=logits,
            value=jnp.where(terminal, 0.0, value).astype(jnp.float32),
        )
        return out, handle

    ids = jnp.arange(b, dtype=jnp.int64)
    handle = _mix(ids + 7 * (env.seed + 1)) | _CORRECT_BIT
    logits, value = node_outputs(handle)
    root = mctx.RootFnOutput(prior_logits=logits, value=value.astype(jnp.float32), embedding=handle)
    if gumbel:
        run = jax.jit(lambda r, key: mctx.gumbel_muzero_policy(
            (), key, r, recurrent_fn, num_simulations=num_simulations, invalid_actions=jnp.isneginf(r.prior_logits)))
    else:
        run = jax.jit(lambda r, key: mctx.muzero_policy(
            (), key, r, recurrent_fn, num_simulations=num_simulations, invalid_actions=jnp.isneginf(r.prior_logits),
            dirichlet_fraction=0.0))
    key = jax.random.PRNGKey(0)
    jax.block_until_ready(run(root, key))  # compile
    # A small search takes milliseconds: time enough calls for a tenth of a second per measurement.
    start = clock()
    jax.block_until_ready(run(root, key))
    calls = max(1, math.ceil(0.1 / max(clock() - start, 1e-6)))
    best = 0.0
    for _ in range(repeats):
        start = clock()
        for _ in range(calls):
            out = jax.block_until_ready(run(root, key))
        best = max(best, calls * b * num_simulations / (clock() - start))
    assert out.action.shape == (b,)
    # Every simulation adds a node (mctx has no terminal nodes); the handle holds the depth.
    depth = float(jnp.mean(out.search_tree.embeddings >> _DEPTH_SHIFT))
    return best, depth


def ops_per_step(env: SyntheticEnv, b: int, num_simulations: int) -> float:
    """ATen ops dispatched per simulation step of muzero_policy over b trees (environment included):
    on CPU each op's fixed cost, not its arithmetic, sets the rate at small B."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    root = env.root(b)
    with Count():
        mcts.muzero_policy(root, env.expand, num_simulations=num_simulations, dirichlet_fraction=0.0)
    return Count.ops / num_simulations


def check_same_environment(env: SyntheticEnv) -> None:
    """The baseline's scalar environment must return what the tensor one returns."""
    scalar = ScalarEnv(env)
    root = env.root(3)
    parents = root.handle.unsqueeze(-1).expand(3, env.num_actions).contiguous()
    actions = torch.arange(env.num_actions).expand(3, env.num_actions).contiguous()
    out = env.expand(parents, actions, torch.ones_like(parents, dtype=torch.bool))
    for i in range(3):
        for a in range(env.num_actions):
            r, _, logits, v, h, _ = scalar.expand(int(parents[i, a]), a)
            assert h == int(out.handle[i, a]) and r == float(out.reward[i, a])
            assert abs(v - float(out.value[i, a])) < 1e-6
            assert all(
                (x == -math.inf and math.isinf(float(y))) or abs(x - float(y)) < 1e-5
                for x, y in zip(logits, out.prior_logits[i, a])
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny run: B in {1, 8, 64}, 16 simulations")
    parser.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when present)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (small ops: 1 is fastest)")
    parser.add_argument("--simulations", type=int, default=None, help="simulations per tree")
    parser.add_argument("--compiled", action="store_true", help="also time mcts.search(compiled=True) (C++ on CPU, Triton on CUDA)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the fastest counts (noisy hosts)")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="CPU timer: the process's CPU time (default; shared hosts) or wall time (quiet "
                             "hosts: JAX's helper threads add CPU time that is not search work)")
    parser.add_argument("--sizes", help="comma-separated batch sizes B (default 1,64,1024; --quick 1,8,64); "
                        "the L = 4 and Gumbel lines use the largest")
    parser.add_argument("--depth", type=int, default=6,
                        help="the environment's terminal depth (mctx has no terminal nodes: at 6 its PUCT trees grow "
                             "deeper than ours; 64 keeps both free of terminals within 64 simulations)")
    parser.add_argument("--unroll", type=int, default=None,
                        help="whole iterations per compiled call (mcts.search.UNROLL, default 2), to measure the choice")
    args = parser.parse_args()
    if args.unroll:
        importlib.import_module("mcts.search").UNROLL = args.unroll  # mcts.search is also the function
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    sims = args.simulations or (16 if args.quick else 64)
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else [1, 8, 64] if args.quick else [1, 64, 1024]
    env = SyntheticEnv(num_actions=8, depth=args.depth, discount=0.97)
    check_same_environment(env)
    runs = [python_baseline(env, 4 if args.quick else 16, sims) for _ in range(args.repeats)]
    base_rate, base_visits = max(r[0] for r in runs), runs[0][1]
    clock = "wall time" if device.startswith("cuda") or args.clock == "wall" else "process CPU time"
    print(f"device={device} threads={args.threads} K={env.num_actions} depth={env.depth} simulations/tree={sims} clock={clock}")
    print(f"baseline plain Python, one tree at a time: {base_rate:,.0f} sim/s")
    configs = [(mcts.muzero_policy, b, 1) for b in sizes]
    configs += [(mcts.muzero_policy, sizes[-1], 4), (mcts.gumbel_muzero_policy, sizes[-1], 1)]
    for policy, b, leaves in configs:
        runs = [batched(env, policy, b, sims, leaves, device) for _ in range(args.repeats)]
        rate, visits, depth = max(r[0] for r in runs), runs[0][1], runs[0][3]
        line = f"{policy.__name__:22s} B={b:5d} L={leaves}: {rate:>11,.0f} sim/s  x{rate / base_rate:6.2f} vs baseline"
        if policy is mcts.muzero_policy and leaves == 1:
            # Same algorithm, same trees: the root visit counts must match the baseline's.
            n = min(b, len(base_visits))
            same = sum(visits[i].tolist() == base_visits[i] for i in range(n))
            line += f"  (root visits equal to baseline in {same}/{n} trees)"
        if device.startswith("cuda") and leaves == 1:
            split = max(batched(env, policy, b, sims, leaves, device, split=True)[0] for _ in range(args.repeats))
            eager = max(batched(env, policy, b, sims, leaves, device, graphs=False)[0] for _ in range(args.repeats))
            line += f"\n{'  graphs, expand eager between them':34s}: {split:>11,.0f} sim/s"
            line += f"\n{'  no CUDA graphs (eager)':34s}: {eager:>11,.0f} sim/s  graphs x{rate / eager:5.2f}"
        fast = None
        if args.compiled and leaves == 1:
            try:
                runs = [batched(env, policy, b, sims, leaves, device, compiled=True)]
            except RuntimeError as e:  # the compiler failed on this search (seen: Triton, Gumbel, CUDA)
                line += f"\n{'  compiled (torch.compile)':34s}: failed: {e}"
            else:
                compile_seconds = runs[0][2]  # later warm-ups reuse this process's compiled code
                runs += [batched(env, policy, b, sims, leaves, device, compiled=True) for _ in range(args.repeats - 1)]
                fast, fast_visits = max(r[0] for r in runs), runs[0][1]
                # Fused exp/log/sums round differently in the last bit: near ties can go the other way.
                same = sum(torch.equal(x, y) for x, y in zip(fast_visits, visits))
                ref = "graphs" if device.startswith("cuda") else "eager"  # the default path it is compared with
                line += (
                    f"\n{'  compiled (torch.compile)':34s}: {fast:>11,.0f} sim/s  x{fast / rate:5.2f} {ref}"
                    f"  (first search, compiling: {compile_seconds:.0f} s wall; root visits equal to {ref} in {same}/{b} trees)"
                )
        peer = mctx_rate(env, b, sims, policy is mcts.gumbel_muzero_policy, args.repeats, device) if leaves == 1 else None
        if peer is not None:
            peer, peer_depth = peer
            line += f"\n{'  mctx (JAX jit), same B':34s}: {peer:>11,.0f} sim/s  ours/mctx x{rate / peer:5.2f}"
            if fast is not None:
                line += f"  compiled/mctx x{fast / peer:5.2f}"
            # The trees' shapes differ (mctx has no terminal nodes): the walks' lengths with them.
            line += f"\n{'  mean node depth':34s}: ours {depth:.2f}, mctx {peer_depth:.2f}"
        print(line)
    counts = ", ".join(f"B={b}: {ops_per_step(env, b, sims):.0f}" for b in sizes[:2])
    print(f"ATen ops per simulation step (muzero_policy, environment included): {counts}")
    if importlib.util.find_spec("mctx") is None:
        print("mctx not installed: pip install -e '.[bench]' adds DeepMind's mctx as the peer")

if __name__ == "__main__":
    main()
