"""Prefect flows over the engine: generate, rescore, derive, export, train_dpo/sft/grpo,
evaluate, pipeline and demo (best-of-N beside the pipeline), plus schedules (deployments with
cron) and the runtime (thread or Ray task runner, retries, the accelerator concurrency limit).
Flows are thin: the work is in dataengine/ and storage/. Importing this package imports
Prefect; import the submodules you need."""

import os

# Before Prefect is imported: no telemetry from the embedded API (no network), and time for it
# to create its database on a busy machine (the 20 s default is short on 2 shared cores).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
# Concurrency leases on disk beside the database, not in the embedded API's memory: a slot held
# by a killed process can then be found and given back (flows.runtime.reclaim_dead_slots).
FILE_LEASES = "prefect.server.concurrency.lease_storage.filesystem"
os.environ.setdefault("PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE", FILE_LEASES)
# Prefect creates only the last level of PREFECT_HOME; with a missing parent its embedded API
# fails to open its database and the flow waits on it (seen with PREFECT_HOME=./.cache/prefect).
if os.environ.get("PREFECT_HOME"):
    os.makedirs(os.path.expanduser(os.environ["PREFECT_HOME"]), exist_ok=True)
