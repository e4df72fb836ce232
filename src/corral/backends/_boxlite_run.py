"""The relay of one ``boxlite`` run: ``python -I _boxlite_run.py CONFIG_FD``.

corral's engine starts this program (through corral's exec helper, in its
own session and in the run's cgroup) in place of the command, with the run's
configuration (JSON, written by :meth:`BoxliteBackend.plan
<corral.backends.boxlite.BoxliteBackend.plan>`) on fd *CONFIG_FD*. It:

* creates the box with BoxLite's Python API (``boxlite.Boxlite`` with a home
  directory of corral's, ``BoxOptions`` built by :func:`box_options`) and
  waits at most ``boot_timeout`` seconds for it to start: a KVM that hangs
  guests is a set-up failure (exit 125), not a hung run;
* runs the command there (``Box.exec`` with the policy's environment, the
  working directory and the guest user), relays its stdin when the run has
  one, and its stdout and stderr chunk by chunk to fds 1 and 2, where the
  engine caps, digests and forwards them as for every backend;
* passes on the signals the engine sends: SIGINT, SIGQUIT, SIGHUP, SIGUSR1,
  SIGUSR2 go to the command; SIGTERM (a timeout or a stop) kills it;
* stops the box (BoxLite removes it: ``auto_remove``), then exits with the
  command's status, or kills itself with the command's signal.

Whatever BoxLite leaves running is in the run's cgroup, which the engine
kills when this program exits: the plan always has one (docs/backends/boxlite.md).
Errors before the command starts are printed on stderr and exit 125.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

#: Signals passed on to the command as they are.
RELAYED = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
EXIT_SETUP = 125


def box_options(boxlite: Any, config: dict[str, Any]) -> Any:
    """``boxlite.BoxOptions`` for the plan's ``box`` section (*boxlite*: the imported module).

    The guest gets no network interface (``mode="disabled"``: the plan
    refuses every other network mode) and only the volumes the plan lists.
    """
    box = config["box"]
    return boxlite.BoxOptions(
        rootfs_path=box["rootfs_path"],
        cpus=box["cpus"],
        memory_mib=box["memory_mib"],
        working_dir=box["working_dir"],
        env=[],  # the command's environment is given per exec, complete
        volumes=[(host, guest, read_only) for host, guest, read_only in box["volumes"]],
        network=boxlite.NetworkSpec(mode="disabled"),
        auto_remove=True,
    )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BrokenPipeError:
            return
        view = view[n:]


async def _copy_out(stream: Any, fd: int) -> None:
    if stream is None:
        return
    async for chunk in stream:
        _write_all(fd, chunk if isinstance(chunk, bytes) else str(chunk).encode("utf-8"))


async def _copy_in(writer: Any) -> None:
    loop = asyncio.get_running_loop()
    while True:
        data = await loop.run_in_executor(None, os.read, 0, 65536)
        if not data:
            break
        await writer.send_input(data)
    close = getattr(writer, "close", None)
    if close is not None:
        result = close()
        if asyncio.iscoroutine(result):
            await result


async def _run(config: dict[str, Any]) -> int:
    try:
        import boxlite
    except ImportError as exc:
        print(f"corral: Failed to start the BoxLite VM: {exc}", file=sys.stderr)
        return EXIT_SETUP
    runtime = boxlite.Boxlite(boxlite.Options(home_dir=config["home"]))
    try:
        box = await asyncio.wait_for(
            runtime.create(box_options(boxlite, config)), config["boot_timeout"]
        )
        await asyncio.wait_for(box.start(), config["boot_timeout"])
    except TimeoutError:
        print(
            f"corral: Failed to start the BoxLite VM: it did not boot in "
            f"{config['boot_timeout']:.0f} s (a KVM that does not run standard guests?)",
            file=sys.stderr,
        )
        return EXIT_SETUP
    except Exception as exc:
        print(f"corral: Failed to start the BoxLite VM: {exc}", file=sys.stderr)
        return EXIT_SETUP
    try:
        ex = config["exec"]
        try:
            execution = await box.exec(
                ex["argv"][0],
                args=ex["argv"][1:],
                env=[tuple(kv) for kv in ex["env"]],
                user=ex["user"],
                cwd=ex["cwd"],
            )
        except Exception as exc:
            print(f"corral: Failed to run the command in the BoxLite VM: {exc}", file=sys.stderr)
            return EXIT_SETUP
        loop = asyncio.get_running_loop()
        sent: set[asyncio.Task[Any]] = set()  # held until done (the loop keeps weak references)

        def relay(signum: int) -> None:
            # SIGTERM is a timeout or a stop: the command is killed
            call = execution.kill() if signum == signal.SIGTERM else execution.signal(signum)
            task = loop.create_task(call)
            sent.add(task)
            task.add_done_callback(sent.discard)

        for signum in (*RELAYED, signal.SIGTERM):
            loop.add_signal_handler(signum, relay, int(signum))
        pumps = [
            asyncio.ensure_future(_copy_out(execution.stdout(), 1)),
            asyncio.ensure_future(_copy_out(execution.stderr(), 2)),
        ]
        feeder = asyncio.ensure_future(_copy_in(execution.stdin())) if config["stdin"] else None
        result = await execution.wait()
        await asyncio.gather(*pumps, return_exceptions=True)
        if feeder is not None:
            feeder.cancel()
        code = int(result.exit_code)
        return code  # negative: BoxLite's "killed by that signal"
    finally:
        try:
            await box.stop()
        except Exception as exc:
            print(
                f"corral: BoxLite did not stop the VM ({exc}); the run's end kills it",
                file=sys.stderr,
            )


def main(argv: list[str]) -> int:
    """Read the configuration from fd ``argv[0]``, run; the exit status, or die of the signal."""
    with os.fdopen(int(argv[0]), "rb") as f:
        config = json.loads(f.read())
    status = asyncio.run(_run(config))
    if status < 0:  # the command died of a signal: so does this program (as on the host)
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
