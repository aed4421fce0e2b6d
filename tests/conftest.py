"""Fixtures shared by the test modules: the tiny random policy, a sandboxed ToolEnv over the
arithmetic tools, and a private Prefect API. A module that needs another env (other toolboxes,
other limits) defines its own fixture of the same name, which wins over these."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny():
    """The tiny random-weight policy (hf backend, CPU): exercises code paths, learns nothing."""
    from dataengine.policy import make_policy

    return make_policy("hf", "tiny")


@pytest.fixture(scope="module")
def env():
    """A ToolEnv over a one-worker sandbox with the arithmetic toolbox preloaded, 6 steps."""
    from dataengine.env import ToolEnv
    from dataengine.tools.sandbox import Sandbox

    with Sandbox(workers=1, preload=["arithmetic"]) as sandbox:
        yield ToolEnv(sandbox, max_steps=6)


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """A private PREFECT_HOME, so a private ephemeral API database, for one module's flows;
    the kept policies and sandboxes are released afterwards."""
    from flows.runtime import private_prefect_home, release_resources

    with private_prefect_home(tmp_path_factory.mktemp("prefect")):
        yield
    release_resources()
