"""Jobs: one module per job, reading and writing Delta tables and logging to MLflow; the CLI; the Spark session.

The public API is one function per ``erg`` command, under the command's name, the same function the CLI calls::

    import jobs
    from jobs.platform.config import load_config
    from jobs.platform.spark import get_spark

    cfg = load_config("local")
    spark = get_spark(cfg)
    jobs.ingest(spark, cfg)
    jobs.run(spark, cfg, incremental=True)      # ingest -> extract -> embed -> retrieve -> generate
    jobs.sql(spark, cfg, "SELECT style, count(*) FROM erg.augmented_captions GROUP BY style").show()

Each is imported on first use, so ``import jobs`` (and ``import jobs.platform.config``) imports no Spark. Most of
these names are also the names of the modules that hold them (``jobs.ingest`` the module holds ``ingest`` the
function): on the package the name is the function; reach a module with ``from jobs.<module> import ...`` or
``importlib.import_module("jobs.<module>")``, not ``import jobs.<module> as m``.
"""
from __future__ import annotations

import importlib
import sys
import types

#: ``erg`` command -> (module, function) that the CLI calls for it
COMMANDS = {
    "ingest": ("jobs.ingest", "ingest"),
    "extract": ("jobs.extract", "extract"),
    "embed": ("jobs.embed", "embed"),
    "retrieve": ("jobs.retrieve", "retrieve"),
    "generate": ("jobs.generate", "generate_augmented"),
    "run": ("jobs.pipeline", "run_pipeline"),
    "train": ("jobs.train", "train"),
    "evaluate": ("jobs.evaluate", "evaluate"),
    "experiment": ("jobs.experiment", "run_experiment"),
    "sql": ("jobs.sql_access", "sql"),
    "compare": ("jobs.compare", "compare"),
}
__all__ = list(COMMANDS)


def _stage(command: str):
    module, function = COMMANDS[command]
    return getattr(importlib.import_module(module), function)


def _export(command: str) -> property:
    # a property on the package's class, not a module __getattr__: importing the submodule jobs.ingest sets the
    # package attribute `ingest` to the module, which would hide a __getattr__ export of the same name
    def set_submodule(package, value) -> None:
        if not isinstance(value, types.ModuleType):
            raise AttributeError(f"jobs.{command} is the `erg {command}` function and cannot be replaced; patch "
                                 f"{COMMANDS[command][1]} on {COMMANDS[command][0]} instead")

    return property(lambda package: _stage(command), set_submodule, doc=f"the `erg {command}` function")


class _Jobs(types.ModuleType):
    def __dir__(self):
        return sorted({*super().__dir__(), *COMMANDS})


for _command in COMMANDS:
    setattr(_Jobs, _command, _export(_command))
sys.modules[__name__].__class__ = _Jobs
del _command
