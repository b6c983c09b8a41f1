"""The worker metadata, by the Rust probe's rules."""

import os

from trainstate import _probe


def test_fnv1a64_matches_the_rust_probes_reference_vectors():
    assert _probe.fnv1a64(b"") == 0xCBF29CE484222325
    assert _probe.fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert _probe.fnv1a64(b"foobar") == 0x85944171F73967E8


def test_visible_devices_give_indexes_only():
    assert _probe.parse_visible_devices("0, 2,3,2") == [0, 2, 3]
    for value in ["", "  ", "-1", "none", "all", "GPU-5c8a1b2e", "MIG-1", "0,,1", "1,x"]:
        assert _probe.parse_visible_devices(value) is None, value
    assert _probe.gpu_ids({"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "0,1"}) == [1]
    assert _probe.gpu_ids({"NVIDIA_VISIBLE_DEVICES": "0,1"}) == [0, 1]
    assert _probe.gpu_ids({}) == []


def test_the_node_id_is_the_machine_id_else_a_hash_of_the_hostname(tmp_path):
    machine_id = tmp_path / "machine-id"
    machine_id.write_text("  4c4c4544-0042\n")
    assert _probe.node_id(str(machine_id)) == "4c4c4544-0042"
    machine_id.write_text("\n")
    assert _probe.node_id(str(machine_id), host="gpu-17") == "host-{:016x}".format(_probe.fnv1a64(b"gpu-17"))
    assert _probe.node_id(str(tmp_path / "missing"), host="gpu-17").startswith("host-")


def test_the_node_ip_is_the_interface_that_routes_to_the_head():
    assert _probe.route_to("127.0.0.1", 8266) == ("127.0.0.1", None)
    ip, reason = _probe.route_to("no-such-host.invalid", 8266)
    assert ip == "127.0.0.1" and reason


def test_resources_count_usable_cpus_and_visible_gpus():
    cpus = len(os.sched_getaffinity(0))
    assert 1 <= _probe.resources([])["CPU"] <= cpus
    assert _probe.resources([0, 1])["GPU"] == 2.0
