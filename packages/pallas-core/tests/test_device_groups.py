"""``pallas.plugins.DeviceGroups``: where the devices of one multi-device kernel call meet."""

from __future__ import annotations

import pytest

from pallas.plugins import DeviceGroups


class _Group:
    def __init__(self, num_devices: int):
        self.num_devices = num_devices
        self.failures: list = []

    def fail(self, exc: BaseException, where: str) -> None:
        self.failures.append((exc, where))


def test_each_devices_nth_call_joins_the_nth_group_and_the_last_to_leave_forgets_it():
    groups = DeviceGroups()
    made = []

    def make():
        made.append(_Group(2))
        return made[-1]

    first = groups.join("k", 0, make)
    assert groups.join("k", 1, make) is first  # device 1's first call: the same group
    second = groups.join("k", 0, make)  # device 0's second call: a new one
    assert second is not first and len(made) == 2
    assert groups.join("other", 0, make) is made[2]  # another kernel: its own group
    groups.leave(first)
    groups.leave(first)
    # Both devices left the first group; device 1's second call joins device 0's second.
    assert groups.join("k", 1, make) is second


def test_reset_fails_every_running_group_and_starts_counting_again():
    groups = DeviceGroups()
    group = groups.join("k", 0, lambda: _Group(2))
    reason = RuntimeError("reset_my_interpret_mode_state()")
    groups.reset(reason)
    assert group.failures == [(reason, "a reset")]
    fresh = groups.join("k", 0, lambda: _Group(2))
    assert fresh is not group and fresh.failures == []


@pytest.mark.parametrize("device", [0, 1])
def test_the_group_made_knows_its_registry_key(device):
    groups = DeviceGroups()
    group = groups.join("k", device, lambda: _Group(2))
    assert group.registry_key == ("k", 1)
