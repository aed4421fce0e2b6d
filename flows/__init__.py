"""Prefect flows over the engine: generate, rescore, derive, export, train_dpo/sft/grpo,
evaluate and pipeline, plus schedules (deployments with cron) and the runtime (thread or Ray
task runner, retries, the accelerator concurrency limit). Flows are thin: the work is in
dataengine/ and storage/. Importing this package imports Prefect; import the submodules you need."""

import os

# Before Prefect is imported: no telemetry from the embedded API (no network), and time for it
# to create its database on a busy machine (the 20 s default is short on 2 shared cores).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
