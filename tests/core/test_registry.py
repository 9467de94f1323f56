"""The component registry: a second instance of a component beside a running one gets its own record."""

import os
import subprocess

from obshub.core import registry
from obshub.core.settings import load_settings


def test_a_second_instance_gets_its_own_record_and_a_stale_one_is_reused(tmp_path):
    settings = load_settings(home=tmp_path)
    assert registry.free_name(settings, "rules") == "rules"
    registry.register_component(settings, "rules", os.getpid())
    second = registry.free_name(settings, "rules")
    assert second == "rules-2"
    registry.register_component(settings, second, os.getpid())
    assert registry.free_name(settings, "rules") == "rules-3"
    assert {c["name"] for c in registry.components(settings)} == {"rules", "rules-2"}
    registry.unregister_component(settings, "rules-2")
    assert [c["name"] for c in registry.components(settings)] == ["rules"], "a stop removes only its own record"
    dead = subprocess.Popen(["true"])
    dead.wait()
    registry.register_component(settings, "rules", dead.pid)
    assert registry.free_name(settings, "rules") == "rules", "a record whose pid is gone is free"
