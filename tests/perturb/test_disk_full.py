"""Disk full (root only: tmpfs mounts): the soak's filler, and a validator whose disk fills up stops
the node (it used to stay up forever with consensus stopped) and recovers after a restart."""
import os
import subprocess
import time

import pytest

from devtools.perturb.faults import FILLER, fill
from devtools.testnet import Testnet

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def mount_tmpfs(path, mib):
    path.mkdir(mode=0o700, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "h9test", str(path)], check=True)


def test_fill_writes_until_the_file_system_is_full(tmp_path):
    mount_tmpfs(tmp_path / "disk", 1)
    try:
        written = fill(tmp_path / "disk")
        assert 1_000_000 <= written <= 1 << 20
        with pytest.raises(OSError):
            (tmp_path / "disk" / "more").write_bytes(b"x" * 4096)
        os.unlink(tmp_path / "disk" / FILLER)
        (tmp_path / "disk" / "more").write_bytes(b"x" * 4096)
    finally:
        subprocess.run(["umount", "-l", str(tmp_path / "disk")])


def test_validator_with_a_full_disk_stops_then_recovers_after_restart(tmp_path):
    net = Testnet.create(tmp_path / "net", 4, chain_id="dekube-diskfull", settings={"node.log_level": "warning"})
    node = net.nodes[3]
    data = node.home / "data"
    mount_tmpfs(data, 32)
    try:
        net.up(wait_height=3, timeout=90)
        fill(data)
        deadline = time.monotonic() + 30
        while net.is_running(node) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not net.is_running(node), "a validator that cannot persist must stop, not idle forever"
        assert net._procs[node.name].returncode == 1
        assert "validator failed" in node.log_file.read_text()
        os.unlink(data / FILLER)
        net.start_node(node)
        top = max(net.height(n) or 0 for n in net.nodes[:3])
        net.wait_height(top + 2, timeout=90)       # the restarted validator catches up with the others
    finally:
        for each in net.nodes:
            net.kill_node(each)
        subprocess.run(["umount", "-l", str(data)])
