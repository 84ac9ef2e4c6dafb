"""tests/fleet.py, the fleet of real sshds on 127.0.0.1 the fleet tests deploy to: each device
runs its own python3, sftp works, and Ansible reads the inventories it writes and reaches the
devices that are up (host keys pinned).

In CI (EDGEPACK_REQUIRE_SSH=1) a missing sshd, or no onnxruntime 1.16.3 for the old device, fails
these tests; EDGEPACK_REQUIRE_ARM=1 likewise for the aarch64 device. Elsewhere they skip.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import arm_userland
import fleet
import onnxruntime
import pytest
from fleet import Device, Fleet, require

BIN = Path(sys.executable).parent



@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    require(fleet.problem(), "EDGEPACK_REQUIRE_SSH")
    old = fleet.old_onnxruntime_python()
    arm_reason = arm_userland.problem("py311")
    devices = [Device("pi-01"), Device("pi-02"), Device("pi-down", down=True)]
    if not isinstance(old, str):
        devices.append(Device("pi-old", python=old))
    if not arm_reason:
        arm_userland.build("py311")
        devices.append(Device("pi-arm", python=arm_userland.python("py311")))
    with Fleet(tmp_path_factory.mktemp("fleet"), devices) as f:
        yield f, old, arm_reason


@pytest.fixture
def devices(setup):
    return setup[0]


def test_each_device_runs_its_own_python3(devices):
    for name in ("pi-01", "pi-02"):
        r = devices.ssh(name, "command -v python3; python3 -c 'import sys, onnxruntime; "
                              "print(sys.executable, onnxruntime.__version__)'")
        assert r.returncode == 0, r.stderr
        wrapper, answer = r.stdout.splitlines()
        assert wrapper == str(devices.device_dir(name) / "bin" / "python3")
        assert answer.split() == [sys.executable, onnxruntime.__version__]
    assert len({devices.port(n) for n in devices.names}) == len(devices.names)
    assert devices.remote_dir("pi-01") != devices.remote_dir("pi-02")


def test_a_down_device_is_unreachable(devices):
    r = devices.ssh("pi-down", "true")
    assert r.returncode == 255 and "refused" in r.stderr


def test_old_onnxruntime_device(setup):
    devices, old, _ = setup
    require(old if isinstance(old, str) else None, "EDGEPACK_REQUIRE_SSH")
    r = devices.ssh("pi-old", "python3 -c 'import onnxruntime, numpy; "
                              "print(onnxruntime.__version__, numpy.__version__)'")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [fleet.OLD_ORT, fleet.OLD_NUMPY]


def test_aarch64_device(setup):
    devices, _, arm_reason = setup
    require(arm_reason, "EDGEPACK_REQUIRE_ARM")
    r = devices.ssh("pi-arm", "python3 -c 'import platform; print(platform.machine())'")
    assert (r.returncode, r.stdout.strip()) == (0, "aarch64"), r.stderr


def test_sftp_puts_into_the_remote_dir(devices, tmp_path):
    payload = tmp_path / "payload.txt"
    payload.write_text("hello fleet\n")
    for name in ("pi-01", "pi-02"):
        dest = devices.remote_dir(name) / "payload.txt"
        r = subprocess.run(["sftp", "-F", str(devices.ssh_config), "-b", "-", name],
                           input=f"put {payload} {dest}\n", capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert dest.read_text() == "hello fleet\n"


@pytest.mark.parametrize("fmt", ["ini", "yaml"])
def test_ansible_inventory_lists_every_host_with_its_vars(devices, tmp_path, fmt):
    groups = {"cams": ["pi-01", "pi-down"], "rest": [n for n in devices.names if n != "pi-01"]}
    inventory = devices.write_inventory(tmp_path / f"hosts.{fmt}", fmt, groups=groups,
                                        extra={"edgepack_channel": "stable"})
    r = subprocess.run([str(BIN / "ansible-inventory"), "-i", str(inventory), "--list"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=ansible_env(tmp_path))
    assert r.returncode == 0, r.stderr
    listing = json.loads(r.stdout)
    hostvars = listing["_meta"]["hostvars"]
    assert sorted(hostvars) == sorted(devices.names)
    for name in devices.names:
        got = hostvars[name]
        assert got["ansible_host"] == "127.0.0.1"
        assert int(got["ansible_port"]) == devices.port(name)
        assert got["edgepack_remote_dir"] == str(devices.remote_dir(name))
        assert got["ansible_ssh_private_key_file"] == str(devices.client_key)
        assert got["ansible_python_interpreter"] == "python3"
        assert got["edgepack_channel"] == "stable"
        assert str(devices.known_hosts) in got["ansible_ssh_common_args"]
    assert sorted(listing["cams"]["hosts"]) == ["pi-01", "pi-down"]
    assert sorted(listing["rest"]["hosts"]) == sorted(groups["rest"])


def ansible_env(tmp_path: Path) -> dict[str, str]:
    """Ansible with no ansible.cfg but an empty one, and its temp and control sockets in tmp."""
    config = tmp_path / "ansible.cfg"
    config.write_text("[defaults]\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ANSIBLE_") and k != "SSH_AUTH_SOCK"}
    env.update(ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_NOCOLOR="1", ANSIBLE_PIPELINING="True",
               ANSIBLE_CONFIG=str(config), ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
               ANSIBLE_SSH_CONTROL_PATH_DIR=str(tmp_path / "cp"),
               LC_ALL=env.get("LC_ALL") or "C.UTF-8")
    return env


@pytest.mark.parametrize("fmt", ["ini", "yaml"])
def test_ansible_pings_the_up_devices_and_not_the_down_one(devices, tmp_path, fmt):
    inventory = devices.write_inventory(tmp_path / f"hosts.{fmt}", fmt)
    r = subprocess.run([str(BIN / "ansible"), "-i", str(inventory), "all", "-m",
                        "ansible.builtin.ping", "--forks", "10"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=ansible_env(tmp_path))
    status = {line.split(" | ")[0]: line.split(" | ")[1].split()[0]
              for line in r.stdout.splitlines() if " | " in line}
    assert status == {n: "UNREACHABLE!" if n == "pi-down" else "SUCCESS"
                      for n in devices.names}, r.stdout + r.stderr
    assert r.returncode == 4   # some host unreachable


def test_known_hosts_are_pinned(devices, tmp_path):
    """A device whose host key is not the pinned one is refused, by ssh and by Ansible."""
    wrong = tmp_path / "known_hosts"
    text = devices.known_hosts.read_text().splitlines()
    ports = [f"[127.0.0.1]:{devices.port(n)}" for n in devices.names]
    keys = [line.split(" ", 1)[1] for line in text]
    wrong.write_text("".join(f"{p} {k}\n" for p, k in zip(ports, keys[1:] + keys[:1],
                                                           strict=True)))
    r = subprocess.run(["ssh", "-F", str(devices.ssh_config), "-o", f"UserKnownHostsFile={wrong}",
                        "pi-01", "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in r.stderr
    inventory = devices.write_inventory(tmp_path / "hosts.ini")
    inventory.write_text(inventory.read_text().replace(str(devices.known_hosts), str(wrong)))
    r = subprocess.run([str(BIN / "ansible"), "-i", str(inventory), "pi-01", "-m",
                        "ansible.builtin.ping"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=ansible_env(tmp_path))
    assert "pi-01 | UNREACHABLE!" in r.stdout, r.stdout + r.stderr


def test_stop_ends_the_sessions_too(tmp_path):
    """A ControlPersist master (as Ansible keeps) must not outlive the fleet's sshd."""
    require(fleet.problem(), "EDGEPACK_REQUIRE_SSH")
    control = tmp_path / "cm"
    with Fleet(tmp_path / "fleet", [Device("a")]) as f:
        r = subprocess.run(["ssh", "-F", str(f.ssh_config), "-o", "ControlMaster=auto", "-o",
                            f"ControlPath={control}", "-o", "ControlPersist=60", "a", "true"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert control.exists()
    check = subprocess.run(["ssh", "-F", str(f.ssh_config), "-o", f"ControlPath={control}",
                            "-O", "check", "a"], capture_output=True, text=True, timeout=60)
    assert check.returncode != 0, "the ControlPersist master still runs after stop()"
