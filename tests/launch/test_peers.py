"""The ranks' bookkeeping (runner/launch/peers.py): how long a silent peer is waited for before it counts as gone."""

from __future__ import annotations

from runner.launch import peers as peers_module
from runner.launch.peers import Peers, stale_after


class DictStore:
    """The few store calls Peers makes, on a dict (torch's stores hold bytes)."""

    def __init__(self):
        self.data: dict[str, bytes] = {}

    def set(self, key, value):
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.data[key]

    def check(self, keys):
        return all(key in self.data for key in keys)

    def add(self, key, amount):
        self.data[key] = str(int(self.data.get(key, b"0")) + amount).encode()
        return int(self.data[key])


def test_heartbeat_limit_is_a_tenth_of_timeout_s():
    """A tenth of hardware.timeout_s, never below 10 s nor above the timeout itself."""
    assert stale_after(600) == 60  # the default timeout: a loaded machine's beat thread is not cut off at 10 s
    assert stale_after(30) == 10  # never below 10 s
    assert stale_after(5) == 5  # never above the timeout itself


def test_a_silent_peer_is_gone_only_after_the_limit(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(peers_module.time, "monotonic", lambda: now[0])
    store = DictStore()
    watcher = Peers(store, rank=0, world_size=2, timeout_s=600)
    store.set("beat/1", "7 12 0.0")  # rank 1's last beat, never renewed
    assert watcher._gone_peers() == []
    now[0] += 59.0
    assert watcher._gone_peers() == []  # a fixed 10 s would have ended the group here
    now[0] += 2.0
    assert watcher._gone_peers() == [1]
    store.set("left/1", "done")  # a peer that said it finished is never gone
    assert watcher._gone_peers() == []
