"""`train` under tf.distribute: N replicas train like one device; workers stay in sync.

Each test runs tests/distributed_worker.py in fresh processes (logical devices
and MultiWorkerMirroredStrategy must be configured before TensorFlow starts).
Only loopback traffic; every process has a timeout.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import h5py
import numpy as np
import pytest

WORKER = pathlib.Path(__file__).resolve().parent / "distributed_worker.py"
TIMEOUT = 900  # a ceiling that only catches hangs, not a speed requirement


def last_json_line(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON result in the output:\n{text}")


def worker_env(**extra):
    # TF_GRPC_REUSE_PORT: TensorFlow's gRPC server binds with SO_REUSEPORT (see reserve_loopback_ports).
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", TF_GRPC_REUSE_PORT="1")
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def test_mirrored_two_replicas_train_like_one_device(tmp_path, spm500):
    """Same global batches, dropout 0: MirroredStrategy over two CPU devices gives the
    one-device loss after every step, although the two halves of each batch hold
    different numbers of target tokens (the loss divides by the global count)."""
    done = subprocess.run(
        [sys.executable, str(WORKER), "mirrored", str(tmp_path), spm500],
        capture_output=True,
        text=True,
        env=worker_env(),
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = last_json_line(done.stdout)
    assert result["replicas"] == {"mirrored": 2, "one_device": 1}
    tokens = np.array(result["replica_tokens"])
    assert len(tokens) == len(result["mirrored"]) == len(result["one_device"]) == 6
    assert np.any(tokens[:, 0] != tokens[:, 1]), tokens  # unequal halves: a per-replica mean would differ
    np.testing.assert_allclose(result["mirrored"], result["one_device"], rtol=2e-5)
    assert result["mirrored"][-1] < result["mirrored"][0]
    assert result["max_weight_diff"] < 1e-3


def test_mirrored_two_replicas_apply_the_one_device_gradient(tmp_path, spm500):
    """The gradient Keras hands the optimizer after summing the two replicas' gradients (captured by an
    optimizer that writes it into the weights) equals the one-device gradient and the tape's gradient of
    the mean loss over the global batch's real tokens, within float32 rounding. Adam's update does not
    change when the gradient is scaled by a constant: this checks the scale. The halves of the batch hold
    different numbers of tokens, so a replica dividing by its own count (even averaged over the replicas)
    fails, as does a loss scaled by the replica count."""
    done = subprocess.run(
        [sys.executable, str(WORKER), "gradients", str(tmp_path), spm500],
        capture_output=True,
        text=True,
        env=worker_env(),
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    count = last_json_line(done.stdout)["variables"]
    arrays = np.load(tmp_path / "gradients.npz")
    tokens = arrays["replica_tokens"]
    assert tokens[0] != tokens[1], tokens
    runs = {name: [arrays[f"{name}_{i}"] for i in range(count)] for name in ("mirrored", "one_device", "reference")}
    scale = max(float(np.max(np.abs(g))) for g in runs["reference"])
    assert scale > 0 and count > 10
    for i, reference in enumerate(runs["reference"]):
        for name in ("mirrored", "one_device"):
            np.testing.assert_allclose(runs[name][i], reference, rtol=1e-4, atol=1e-6 * scale, err_msg=f"{name} {i}")


def reserve_loopback_ports(count):
    """`count` free loopback ports, kept bound (not listening) by sockets that the caller closes once
    the workers are done.

    Picking a free port and releasing it before a worker binds it is a race: anything may take the
    port in between. Here the port stays bound all along, with SO_REUSEPORT, which a worker can
    share only if its gRPC server sets SO_REUSEPORT too: TensorFlow does when `TF_GRPC_REUSE_PORT=1`
    (see `worker_env`); nothing else can bind the port. A bound socket that does not listen never
    receives connections, so every connection goes to the worker.
    """
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("127.0.0.1", 0))
    except BaseException:
        for s in sockets:
            s.close()
        raise
    return sockets


def test_reserved_ports_stay_reserved():
    """Nothing that binds without SO_REUSEPORT can take a reserved port; a port cannot be reserved twice."""
    sockets = reserve_loopback_ports(2)
    try:
        ports = [s.getsockname()[1] for s in sockets]
        assert len(set(ports)) == 2 and all(s.getsockname()[0] == "127.0.0.1" for s in sockets)
        for port in ports:
            for address in ("127.0.0.1", "0.0.0.0"):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
                    with pytest.raises(OSError):
                        other.bind((address, port))
    finally:
        for s in sockets:
            s.close()


def read_weights(path):
    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
    return arrays


def run_two_workers(mode, run_dir, spm_model):
    """Runs `distributed_worker.py MODE` as the two workers of a loopback cluster; their JSON results."""
    reserved = reserve_loopback_ports(2)  # bound until the workers are done
    cluster = {"worker": [f"127.0.0.1:{s.getsockname()[1]}" for s in reserved]}
    processes = []
    try:
        for index in range(2):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            processes.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), mode, str(run_dir), spm_model],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=worker_env(TF_CONFIG=tf_config),
                )
            )
        outputs = [process.communicate(timeout=TIMEOUT) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
        for s in reserved:
            s.close()
    for process, (out, err) in zip(processes, outputs):
        assert process.returncode == 0, out[-3000:] + err[-3000:]
    return [last_json_line(out) for out, _ in outputs]


def test_multiworker_workers_end_with_identical_weights(tmp_path, spm500):
    run_dir = tmp_path / "run"
    results = run_two_workers("multiworker", run_dir, spm500)
    assert [r["replicas"] for r in results] == [2, 2] and [r["step"] for r in results] == [4, 4]
    assert [r["is_chief"] for r in results] == [True, False]  # only the chief evaluates and exports (examples)

    chief = read_weights(run_dir / "checkpoints" / "ckpt-00000004.weights.h5")
    worker = read_weights(run_dir / "worker-1" / "checkpoints" / "ckpt-00000004.weights.h5")
    earlier = read_weights(run_dir / "checkpoints" / "ckpt-00000002.weights.h5")
    assert chief.keys() == worker.keys() and len(chief) > 10
    for name in chief:
        np.testing.assert_array_equal(chief[name], worker[name], err_msg=name)
    assert any(not np.array_equal(chief[name], earlier[name]) for name in chief)  # it did train
    assert (run_dir / "model.keras").exists() and (run_dir / "worker-1" / "model.keras").exists()


def test_multiworker_trains_with_r_drop(tmp_path, spm500):
    """R-Drop's train step under the multi-worker workaround (vector logs): both workers end alike, and log the
    same global divergence."""
    run_dir = tmp_path / "run"
    results = run_two_workers("multiworker_rdrop", run_dir, spm500)
    assert [r["step"] for r in results] == [4, 4]
    assert float(results[0]["rdrop_kl"]) > 0 and float(results[0]["rdrop_kl"]) == float(results[1]["rdrop_kl"])
    chief = read_weights(run_dir / "checkpoints" / "ckpt-00000004.weights.h5")
    worker = read_weights(run_dir / "worker-1" / "checkpoints" / "ckpt-00000004.weights.h5")
    for name in chief:
        np.testing.assert_array_equal(chief[name], worker[name], err_msg=name)


def test_each_worker_trains_on_its_half_of_the_same_global_batches(tmp_path, spm500):
    """Both workers build the same global batches and keep disjoint halves (auto-shard policy DATA),
    across two `fit` calls, with the corpus in memory and streamed (the one iterator `TrainingData.batches`
    keeps from one call to the next). Were the data not sharded, or the streams seeded apart, a worker
    would train on batches the other worker also trains on, or on none of the global batch."""
    results = run_two_workers("shards", tmp_path / "run", spm500)
    assert [r["worker"] for r in results] == [0, 1] and [r["replicas"] for r in results] == [2, 2]
    for path in ("in_memory", "streamed"):
        first, second = (r[path] for r in results)
        assert first["own_half"] == [True] * 6 and second["own_half"] == [True] * 6, path
        assert first["global_digests"] == second["global_digests"], path
        assert len(set(first["global_digests"])) == 6, path  # six different batches: the stream moved on
        assert all(a != b for a, b in zip(first["local_digests"], second["local_digests"])), path
