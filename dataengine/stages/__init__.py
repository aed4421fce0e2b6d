"""The stage layer: one plain function per stage, `(config, run, shard or inputs, resources) ->
result`, shared by the CLI (dataengine/commands) and the Prefect flows (flows/), which hold no
stage logic of their own.

| stage | function | CLI | flow |
|---|---|---|---|
| generate one shard | `generate.generate_shard` (driver: `generate.generate`) | `dataengine generate` | `generate` |
| rescore one shard | `rescore.rescore_shard` (driver: `rescore.rescore`) | `dataengine rescore` | `rescore` |
| derive datasets | `datasets.derive_datasets` | `dataengine derive` | `derive` |
| export a dataset | `datasets.export_dataset` | `dataengine export` | `export` |
| train one checkpoint | `train.train_checkpoint` | `dataengine train dpo/sft/grpo` | `train_dpo/sft/grpo` |
| evaluate one suite | `evaluate.evaluate_suite` (driver: `evaluate.evaluate`) | `dataengine eval` | `evaluate` |

A stage run over shards or suites has one driver, handed a shard executor: `in_process` (the
CLI: one after another in this process) or the flows' Prefect tasks (threads, or Ray through
prefect-ray), which wrap the stage's `*_at` shard function. This package never imports flows/.

`Resources` (resources.py) holds what a stage works with, built once from the config.
"""

from dataengine.stages.resources import Resources, make_reward, release_resources, shared_resources

__all__ = ["Resources", "make_reward", "release_resources", "shared_resources"]
