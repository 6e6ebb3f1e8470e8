"""The benchmark's measure names: what `bench.__main__` writes into bench.csv and `bench.report` reads back.

One constant per name, so renaming one cannot silently empty a report table.
"""
from __future__ import annotations

# population forward
FORWARD = "forward_evals_per_s"                  # forward alone, noise given
FORWARD_MEMBERS = "forward_members_evals_per_s"  # torch_impl's forward handed the noise per member
FORWARD_MS = "forward_ms"
FORWARD_MEMBERS_MS = "forward_members_ms"
FORWARD_NOISE = "forward_noise_evals_per_s"      # noise generation + forward
FORWARD_NOISE_MS = "forward_noise_ms"
NOISE_MS = "noise_ms"
# round-by-round ratios (torch_impl's speed over the row's impl), with the 95% interval of their median
FORWARD_RATIO = "forward_ratio"
FORWARD_NOISE_RATIO = "forward_noise_ratio"
LAYOUT_RATIO = "forward_layout_ratio"            # torch_impl grouped noise vs per member
MEMBERS_RATIO = "forward_members_ratio"          # torch_impl per member vs hooks
CI_LOW, CI_HIGH = "_ci95_low", "_ci95_high"      # suffixes of a ratio's interval rows
PAIRED = {FORWARD: FORWARD_RATIO, FORWARD_NOISE: FORWARD_NOISE_RATIO}
# machine ceilings and floors
MATMUL = "matmul_gflops"
COPY = "copy_gbps"
FLOOR_MS = "floor_ms"
FLOOR_COMPUTE_MS = "floor_compute_ms"
FLOOR_MEMORY_MS = "floor_memory_ms"
FLOOR_EVALS = "floor_evals_per_s"
FLOOR_FRACTION = "floor_fraction"
FLOOR_FRACTION_MEMBERS = "floor_fraction_members"
# one ES step
STEP = "step_per_s"
STEP_CACHED = "step_cached_per_s"
STEP_RATES = {"step": STEP, "step_cached": STEP_CACHED}
STEP_MS = {"step": "step_ms", "step_cached": "step_cached_ms", "noise": "step_noise_ms",
           "forward": "step_forward_ms", "tell": "step_tell_ms"}
NOISE_SHARE = "noise_share"
NOISE_SHARE_EST = "noise_share_est"
# generators
ALONE_MS = "alone_forward_ms"                    # busy-machine section: the forward in a fresh process, idle
BUSY_MS = "busy_forward_ms"                      # ... the same beside cores + 1 CPU-bound competitors

SOLVE_S = "time_to_solve_s"                      # one training run to a mean return of 475 (model = solve:<preset>)
SOLVE_STEPS = "steps_to_solve"                   # its env steps (the budget if it did not solve)
SOLVE_CPU_S = "time_to_solve_cpu_s"
SOLVE_PHASE_S = "time_to_solve_s:"               # + a phase of bench.solve.PHASES: that phase's share of the run
SOLVE_PHASE_CPU_S = "time_to_solve_cpu_s:"

NORMAL_MS = "normal_ms"
NORMALS = "normals_per_s"
# the byte-level LM (bench/lm.py)
LM_TOKENS = "lm_tokens_per_s"                    # population forward: scored tokens per second
LM_MS = "lm_forward_ms"
LM_RATIO = "lm_forward_ratio"                    # torch_impl's speed over the row's impl, round by round
LM_FLOOR_MS = "lm_floor_ms"                      # the forward's matmul FLOPs at the measured peak
LM_FLOOR_FRACTION = "lm_floor_fraction"
LM_RUN_S = "lm_run_s"                            # a cpu-preset LM training run, one thread, fresh process
LM_RUN_BPB = "lm_run_val_bpb"
# the tree suite at real sizes (bench/tree.py): one row per size (model = the factory), a fresh process each
TREE_S = "tree_check_s"                          # wall time of `python -m parity check --task tree`
TREE_RSS = "tree_check_peak_rss_gib"             # its peak resident memory
TREE_PARAMS = "tree_check_params"                # the model's parameters (from its report)
TREE_EXIT = "tree_check_exit"                    # its exit code (nan: stopped by the bench)
TREE_CHECK_S = "tree_check_s:"                   # + a check's name: that check's seconds
