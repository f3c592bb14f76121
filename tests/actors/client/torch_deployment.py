# ctest-label: integration
"""The PyTorch client (tiny_transformer.py) over a real deployment: a
scheduler node and a decode node run as `dualpath node` processes on
127.0.0.1, the engine's own node lives in this process (dualpath.Client.join).
Prefill of turn t+1 with its prefix loaded on the remote DE path (the decode
node reads, its bulk endpoint writes over tcp into the engine's torch
tensors) and split gives the logits of a full recompute within atol 1e-5 +
rtol 1e-4; the decode node killed (SIGKILL) during a DE load fails that load
within its deadline, the engine recomputes, the logits are the same, and the
next load on the PE path succeeds."""

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

try:
    import torch
except ImportError as e:
    print(f"SKIP actors.client.torch_deployment: PyTorch is not installed "
          f"({e}); apt-get install python3-torch")
    sys.exit(77)

import dualpath
import tiny_transformer as tt

checks = tt.Checklist()
failures = checks.failures
check = checks.check
same_logits = checks.same_logits

# The deployment's settings, the same for every node and the client: the
# tiny model's KV geometry (3 layers, 256 B per token and layer, blocks of 4
# tokens) in real bytes and real time, one-GPU nodes of small memory, and
# storage NICs of 200 kb/s (a 3 KiB block in ~0.12 s), so that a load is
# still reading when its node is killed.
SETS = ["hardware.profile=paper-hopper", "model.profile=ds-27b",
        "model.layers=3", "model.kv_bytes_per_token_layer=256",
        "storage.block_tokens=4", "hardware.gpus_per_node=1",
        "hardware.hbm_gib=0.0625", "hardware.dram_buffer_gib=0.0625",
        "model.total_params=1e6", "model.active_params=1e6",
        "engines.activation_reserve_gib=0.01", "run.byte_scale=1",
        "run.time_scale=1", "run.modes=dualpath",
        "hardware.snic_gbps=0.0002", "workload.max_len=4096",
        "transport.backend=tcp"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    def __init__(self, binary, cluster, name, workdir):
        args = [binary, "node", "--cluster", cluster, "--name", name]
        for kv in SETS:
            args += ["--set", kv]
        self.err_path = os.path.join(workdir, f"{name}.{time.time_ns()}.err")
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=self.err)

    def wait_for(self, text, limit_s=30):
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            with open(self.err_path) as f:
                if text in f.read():
                    return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def log(self):
        with open(self.err_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()


def main():
    build = os.environ.get("DUALPATH_BUILD_DIR", "build")
    binary = os.path.join(build, "bin", "dualpath")
    torch.manual_seed(0)
    rng = random.Random(11)
    cfg = tt.Config()
    bt = cfg.block_tokens
    work = tempfile.mkdtemp(prefix="dp-torch-dep-")
    nodes = []
    try:
        cluster = os.path.join(work, "cluster.toml")
        with open(cluster, "w") as f:
            f.write(f"""[cluster]
scheduler = "sched"
storage = "{work}/store"
bulk_secret = "torch-test-secret-0123456789"

[tls]
mode = "plaintext"

[[node]]
name = "sched"
role = "scheduler"
host = "127.0.0.1"
port = {free_port()}

[[node]]
name = "engine0"
role = "prefill"
host = "127.0.0.1"
bulk_port = {free_port()}

[[node]]
name = "de0"
role = "decode"
host = "127.0.0.1"
bulk_port = {free_port()}
""")
        # A negative patience is refused naming its argument.
        try:
            dualpath.Client.join(cluster, "engine0", sets=SETS,
                                 patience_ms=-1)
            check(False, "a negative patience_ms is refused")
        except ValueError as e:
            check("patience_ms" in str(e) and "deadline_ms" not in str(e),
                  f"the error names patience_ms: {e}")
        sched = Node(binary, cluster, "sched", work)
        nodes.append(sched)
        check(sched.wait_for("listening on"), "the scheduler node started")
        de0 = Node(binary, cluster, "de0", work)
        nodes.append(de0)
        check(de0.wait_for("joined"), "the decode node joined")
        if failures:
            print(sched.log(), de0.log())
            sys.exit(1)

        client = dualpath.Client.join(cluster, "engine0", sets=SETS,
                                      buffer_blocks=32, deadline_ms=10000)
        check((client.layers, client.block_tokens,
               client.bytes_per_token_layer)
              == (cfg.layers, bt, cfg.bytes_per_token_layer),
              "the deployment's KV geometry is the model's")
        engine = tt.Engine(tt.TinyTransformer(cfg, pages=64), client)
        reference = tt.TinyTransformer(cfg, pages=64)

        def full(tokens):
            return reference.prefill(tokens,
                                     list(range(-(-len(tokens) // bt))))

        tokens = [rng.randrange(cfg.vocab) for _ in range(10)]
        for turn, path in enumerate([None, "de", "split"], start=1):
            logits, cached, pages = engine.prefill(tokens, path=path or "auto")
            if path:
                done = engine.last["loaded"]
                check(cached > 0 and done["error"] is None
                      and done["blocks_ok"] * bt == cached,
                      f"turn {turn}: {cached // bt} prefix blocks loaded on "
                      f"path {path} (pe {done['pe_blocks']}, "
                      f"de {done['de_blocks']}): {done['error']}")
                if path == "de":
                    check(done["pe_blocks"] == 0 and done["de_blocks"] > 0,
                          "de path: every block read on the decode node")
            same_logits(logits, full(tokens)[cached:],
                        f"turn {turn} ({len(tokens)} tokens, {cached} cached)")
            engine.release(pages)
            tokens = tokens + [rng.randrange(cfg.vocab) for _ in range(7)]

        # The decode node killed during a DE load of the prefix: the load
        # fails long before its 10 s deadline, the engine recomputes.
        blocks, _ = engine.lookup(tokens)
        scratch = engine.alloc(len(blocks))
        t0 = time.monotonic()
        t = client.start_load(900, blocks, scratch, path="de")
        de0.proc.send_signal(signal.SIGKILL)
        de0.proc.wait()
        try:
            client.wait_for_layer(t, 0)
            check(False, "the load on the killed node failed")
        except dualpath.Error as e:
            check("peer_lost" in str(e), f"the load on the killed node "
                  f"failed: {e}")
        done = client.wait(t)
        waited = time.monotonic() - t0
        client.finished()
        check(done["error"] is not None and done["blocks_ok"] == 0,
              f"nothing of it counts as loaded: {done}")
        check(waited < 5.0, f"it failed after {waited:.2f} s (deadline 10 s)")
        engine.release(scratch)
        logits, cached, pages = engine.prefill(tokens, path="de", save=False)
        check(engine.last["loaded"]["error"] is not None and cached == 0,
              "a DE load with the node gone fails at once: "
              f"{engine.last['loaded']['error']}")
        same_logits(logits, full(tokens), "recompute after the lost node")
        engine.release(pages)
        logits, cached, pages = engine.prefill(tokens, path="pe")
        check(engine.last["loaded"]["error"] is None and cached > 0,
              f"the PE path still loads ({cached} cached)")
        same_logits(logits, full(tokens)[cached:], "PE load after the loss")
        engine.release(pages)
        del engine
        del client
    finally:
        for n in reversed(nodes):
            n.stop()
        shutil.rmtree(work, ignore_errors=True)
    checks.finish()


if __name__ == "__main__":
    main()
