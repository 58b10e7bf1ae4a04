"""bench/compare/torch_launch.py — what the torch peers (gloo_coll.py,
ddp_torch.py) share: argument checking and starting N worker processes of
the calling script that meet through a torch FileStore in a private
temporary directory (no port is ever chosen), with a deadline."""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def bounded_int(lo, hi):
    """argparse type: an integer in [lo, hi]."""
    def conv(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError("not an integer: '%s'" % s)
        if v < lo or v > hi:
            raise argparse.ArgumentTypeError("%d not in %d..%d" % (v, lo, hi))
        return v
    return conv


def launch(script, name, nproc, timeout, argv, env_extra):
    """Run `script --worker R --store PATH argv...` for R in 0..nproc-1 and
    wait for all, at most `timeout` seconds. The first worker that fails,
    or the deadline, stops the others (SIGTERM, then SIGKILL). Returns 0
    when every worker exited 0, else 1 (reported on stderr as `name`)."""
    tmp = tempfile.mkdtemp(prefix="tdist-%s-" % name)
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.update(env_extra)
    procs = []
    status = 0
    try:
        for r in range(nproc):
            cmd = [sys.executable, os.path.abspath(script), "--worker", str(r),
                   "--store", os.path.join(tmp, "store")] + argv
            procs.append(subprocess.Popen(cmd, env=env))
        deadline = time.monotonic() + timeout
        pending = list(procs)
        # Bounded: every turn sleeps 50 ms and the deadline ends the loop.
        while pending and time.monotonic() < deadline:
            for p in list(pending):
                rc = p.poll()
                if rc is None:
                    continue
                pending.remove(p)
                if rc != 0:
                    status = 1
                    print("%s: worker %d exited with status %d" % (name, procs.index(p), rc),
                          file=sys.stderr)
            if status:
                break
            time.sleep(0.05)
        if pending and not status:
            print("%s: deadline of %d s passed" % (name, timeout), file=sys.stderr)
            status = 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        shutil.rmtree(tmp, ignore_errors=True)
    return status
