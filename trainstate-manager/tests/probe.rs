//! Probing a worker's process from explicit inputs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use trainstate_manager::{
    ProbeInputs, ProbeWarning, WorkerMetadata, fnv1a64, parse_visible_devices,
};
use trainstate_schema::Resources;

fn gpus(env: &[(&str, &str)]) -> (Vec<u32>, Vec<ProbeWarning>) {
    let mut inputs = ProbeInputs::empty();
    for (key, value) in env {
        inputs = inputs.with_env(*key, *value);
    }
    let (metadata, warnings) = WorkerMetadata::probe_with_warnings(&inputs);
    (metadata.gpu_ids, warnings)
}

#[test]
fn gpu_ids_come_from_cuda_then_nvidia_visible_devices() {
    assert_eq!(gpus(&[("CUDA_VISIBLE_DEVICES", "0,1,2,3")]), (vec![0, 1, 2, 3], vec![]));
    assert_eq!(gpus(&[("NVIDIA_VISIBLE_DEVICES", "5")]), (vec![5], vec![]));
    // CUDA_VISIBLE_DEVICES wins when both are set.
    assert_eq!(
        gpus(&[("CUDA_VISIBLE_DEVICES", "2"), ("NVIDIA_VISIBLE_DEVICES", "0,1,2,3")]),
        (vec![2], vec![])
    );
}

#[test]
fn unset_empty_hidden_all_and_uuid_forms_give_no_gpus_and_one_warning() {
    let cases: &[&[(&str, &str)]] = &[
        &[],
        &[("CUDA_VISIBLE_DEVICES", "")],
        &[("CUDA_VISIBLE_DEVICES", "-1")],
        &[("NVIDIA_VISIBLE_DEVICES", "none")],
        &[("NVIDIA_VISIBLE_DEVICES", "void")],
        &[("NVIDIA_VISIBLE_DEVICES", "all")],
        &[("CUDA_VISIBLE_DEVICES", "GPU-8b1f6c4e-1d2a-4b6e-9c1a-2f3e4d5c6b7a")],
        &[("CUDA_VISIBLE_DEVICES", "MIG-GPU-8b1f6c4e-1d2a-4b6e-9c1a-2f3e4d5c6b7a/1/0")],
        &[("CUDA_VISIBLE_DEVICES", "0,GPU-1")],
    ];
    for env in cases {
        let (ids, warnings) = gpus(env);
        assert!(ids.is_empty(), "{env:?}");
        assert_eq!(warnings.len(), 1, "{env:?}: {warnings:?}");
        assert!(matches!(warnings[0], ProbeWarning::NoGpuIds { .. }), "{env:?}");
        assert!(warnings[0].to_string().contains("no GPU ids"));
    }
}

#[test]
fn the_node_id_is_the_machine_id_else_a_stable_hash_of_the_hostname() {
    let dir = tempfile::tempdir().unwrap();
    let machine_id = dir.path().join("machine-id");
    std::fs::write(&machine_id, "  4c4c4544004e4b1080 \n").unwrap();
    let inputs = ProbeInputs::empty().with_machine_id_path(&machine_id).with_hostname("gpu-17");
    assert_eq!(WorkerMetadata::probe(&inputs).node_id, "4c4c4544004e4b1080");

    // No file, or an empty one: the hostname's FNV-1a hash, the same every time.
    let missing = ProbeInputs::empty()
        .with_machine_id_path(dir.path().join("absent"))
        .with_hostname("gpu-17");
    let id = WorkerMetadata::probe(&missing).node_id;
    assert_eq!(id, format!("host-{:016x}", fnv1a64(b"gpu-17")));
    assert_eq!(WorkerMetadata::probe(&missing).node_id, id);
    std::fs::write(&machine_id, "\n").unwrap();
    let empty = ProbeInputs::empty().with_machine_id_path(&machine_id).with_hostname("gpu-17");
    assert_eq!(WorkerMetadata::probe(&empty).node_id, id);

    // A machine id is used only when it is a valid node id.
    for (content, used) in
        [("a".repeat(1024), true), ("a".repeat(1025), false), ("4c4c\u{7}4544".to_owned(), false)]
    {
        std::fs::write(&machine_id, &content).unwrap();
        let node_id = WorkerMetadata::probe(&inputs).node_id;
        assert_eq!(node_id == content, used, "{content:?}");
        assert_eq!(node_id == id, !used, "{content:?}");
    }

    // The hostname from the first hostname file, then HOSTNAME.
    let hostname_file = dir.path().join("hostname");
    std::fs::write(&hostname_file, "gpu-17\n").unwrap();
    let mut from_file = ProbeInputs::empty().with_env("HOSTNAME", "other");
    from_file.hostname_paths = vec![dir.path().join("absent"), hostname_file];
    assert_eq!(WorkerMetadata::probe(&from_file).node_id, id);
    let from_env = ProbeInputs::empty().with_env("HOSTNAME", "gpu-17");
    assert_eq!(WorkerMetadata::probe(&from_env).node_id, id);
    assert_ne!(WorkerMetadata::probe(&ProbeInputs::empty().with_hostname("gpu-18")).node_id, id);
}

#[test]
fn the_pid_is_this_process() {
    assert_eq!(WorkerMetadata::probe(&ProbeInputs::empty()).pid, std::process::id());
}

#[test]
fn the_node_ip_routes_to_the_head_else_falls_back_to_loopback() {
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    // No head known: loopback, nothing to warn about.
    let (metadata, warnings) = WorkerMetadata::probe_with_warnings(&ProbeInputs::empty());
    assert_eq!(metadata.node_ip, loopback);
    assert!(warnings.iter().all(|w| !matches!(w, ProbeWarning::NodeIpFallback { .. })));

    // A head on this machine is reached over loopback.
    let head: SocketAddr = "127.0.0.1:8266".parse().unwrap();
    let (metadata, _) = WorkerMetadata::probe_with_warnings(&ProbeInputs::empty().with_head(head));
    assert_eq!(metadata.node_ip, loopback);

    // A remote head: the interface that routes there, or loopback and a
    // warning when no route does.
    let remote: SocketAddr = "192.0.2.1:8266".parse().unwrap();
    let (metadata, warnings) =
        WorkerMetadata::probe_with_warnings(&ProbeInputs::empty().with_head(remote));
    let fell_back = warnings
        .iter()
        .any(|w| matches!(w, ProbeWarning::NodeIpFallback { head, .. } if *head == remote));
    assert_eq!(metadata.node_ip == loopback, fell_back, "{metadata:?} {warnings:?}");
    assert!(!metadata.node_ip.is_unspecified());

    // A configured address wins.
    let configured = IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3));
    let inputs = ProbeInputs::empty().with_head(head).with_node_ip(configured);
    assert_eq!(WorkerMetadata::probe(&inputs).node_ip, configured);
}

#[test]
fn resources_are_the_allotted_ones_else_what_the_process_can_use() {
    let given = Resources::from_iter([("CPU", 4.0), ("GPU", 1.0), ("memory", 1e9)]);
    let inputs = ProbeInputs::empty().with_resources(given.clone());
    assert_eq!(WorkerMetadata::probe(&inputs).resources, given);

    let inputs = ProbeInputs::empty().with_env("CUDA_VISIBLE_DEVICES", "0,1");
    let resources = WorkerMetadata::probe(&inputs).resources;
    let cpus = std::thread::available_parallelism().unwrap().get() as f64;
    assert_eq!(resources.get("CPU"), Some(cpus));
    assert_eq!(resources.get("GPU"), Some(2.0));
    assert_eq!(WorkerMetadata::probe(&ProbeInputs::empty()).resources.get("GPU"), None);
}

#[test]
fn fnv1a64_matches_the_reference_vectors() {
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn visible_devices_are_lists_of_indexes_only() {
    assert_eq!(parse_visible_devices("0"), Some(vec![0]));
    assert_eq!(parse_visible_devices(" 1 ,0 "), Some(vec![1, 0]));
    assert_eq!(parse_visible_devices("3,3,1"), Some(vec![3, 1]), "repeats are dropped");
    for bad in
        ["", " ", "-1", "none", "NoNe", "void", "all", "0,", "0,,1", "0,-1", "+1", "GPU-1", "MIG-a"]
    {
        assert_eq!(parse_visible_devices(bad), None, "{bad:?}");
    }
    assert_eq!(parse_visible_devices("99999999999"), None);
}
