"""Batch placement: many sandbox requests per Ray call, without a batching delay.

A placement group per sandbox costs Ray a two-phase reservation on a raylet,
a record in the control store and two resources in the node's resource view
(which Ray sends around on every change), and the open costs an actor call:
at a thousand sandboxes that was ~17 ms of CPU per sandbox across the GCS,
the raylets and the driver, growing with the number held
(bench/README.md, "cluster").

So the caller's sandbox requests go through one :class:`Placer` thread per
:class:`~corral.cluster._client.Cluster`. It takes the oldest request and
every request waiting with the same shape (the same ``cpus`` and ``memory``,
or the same pinned node), up to :data:`MAX_BATCH`: a lone request is placed
at once, alone; requests that arrive while a placement is under way are
placed together next. A batch of *k* gets **one placement group with one
bundle** of *k* times the request (``{"corral": k, "CPU": k*cpus, "memory":
k*memory}``, one node) and **one** ``open_many`` call to that node's agent.

* Every sandbox keeps its own options, policy checks, audit record, timeout
  and kill on the node: only the reservation and the transport are shared.
* The batch's reservation is a :class:`Lease`: the placement group is
  removed when the last sandbox of the batch closes (or is lost), so until
  then the batch's slots stay reserved on its node.
* A batch no node has room for (Ray leaves its group pending) is given up
  after :data:`SPLIT_AFTER` seconds and its requests queued again, with the
  batch size halved (down to single requests, which wait the full placement
  timeout as before and then fail with ``NoCapacity``); a batch that found
  room doubles it again, up to :data:`MAX_BATCH`.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import InvalidStateError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from concurrent.futures import Future
    from typing import Any

    from ._client import Cluster

__all__ = ["MAX_BATCH", "SPLIT_AFTER", "Lease", "Placement", "Placer"]

#: the most sandbox requests placed (and opened) by one Ray call
MAX_BATCH = 64
#: seconds a batch of more than one waits for a node with room before it is split
SPLIT_AFTER = 2.0


class Lease:
    """A placement group shared by the sandboxes of one batch (``None``: a pinned node's).

    Each sandbox calls :meth:`release` once, when it closes or is lost; the
    group is removed with the last one.
    """

    __slots__ = ("_group", "_left", "_lock")

    def __init__(self, group: Any, count: int) -> None:
        self._group = group
        self._left = count
        self._lock = threading.Lock()

    def release(self) -> None:
        """One sandbox of the batch is done with the reservation."""
        with self._lock:
            self._left -= 1
            group = self._group if self._left == 0 else None
            if group is not None:
                self._group = None
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(group)
            except Exception:  # noqa: S110 - the cluster may be gone: nothing left to release
                pass


class Placement:
    """Where one sandbox request went: its node, the node's agent, the lease, its open.

    ``opened`` is the ObjectRef of the batch's ``open_many`` call (a list with
    one sandbox id - or the error of that one request - per request) and
    ``index`` this request's place in it.
    """

    __slots__ = ("agent", "index", "lease", "node", "opened")

    def __init__(self, node: str, agent: Any, lease: Lease, opened: Any, index: int) -> None:
        self.node = node
        self.agent = agent
        self.lease = lease
        self.opened = opened
        self.index = index


class _Request:
    __slots__ = ("cpus", "future", "memory", "node", "options", "policy")

    def __init__(
        self,
        options: dict[str, Any],
        policy: Any,
        node: str | None,
        cpus: float | None,
        memory: int | None,
        future: Future[Placement],
    ) -> None:
        self.options = options
        self.policy = policy
        self.node = node
        self.cpus = cpus
        self.memory = memory
        self.future = future

    def shape(self) -> tuple[object, ...]:
        return (self.node, self.cpus, self.memory)


class Placer:
    """The thread that places and opens a cluster's sandboxes in batches (module docstring)."""

    def __init__(self, cluster: Cluster, *, timeout: float) -> None:
        self._cluster = cluster
        self._timeout = timeout
        self._queue: deque[_Request] = deque()
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._cap = MAX_BATCH  # halved when a batch found no room, doubled when one did

    def submit(
        self,
        options: dict[str, Any],
        policy: Any,
        *,
        node: str | None = None,
        cpus: float | None = None,
        memory: int | None = None,
    ) -> Future[Placement]:
        """Queue one sandbox request; the future's result is its :class:`Placement`.

        The future fails with the placement's error (``NoCapacity``,
        ``NodeLost``, ``SessionClosed`` once the cluster is closed).
        """
        from concurrent.futures import Future

        from .._exceptions import SessionClosed

        future: Future[Placement] = Future()
        with self._ready:
            if self._closed:
                raise SessionClosed("Failed to use the cluster: it was closed")
            self._queue.append(_Request(options, policy, node, cpus, memory, future))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._main, name="corral-cluster-placer", daemon=True
                )
                self._thread.start()
            self._ready.notify()
        return future

    def close(self) -> None:
        """Fail the requests still waiting and stop the thread (after the batch in hand)."""
        from .._exceptions import SessionClosed

        with self._ready:
            self._closed = True
            waiting = list(self._queue)
            self._queue.clear()
            self._ready.notify()
            thread = self._thread
        for request in waiting:
            try:
                request.future.set_exception(
                    SessionClosed("Failed to place the sandbox: the cluster was closed")
                )
            except InvalidStateError:
                pass  # given up by its caller already
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=60)

    # ------------------------------------------------------------ the thread
    def _main(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                batch = [r for r in self._take() if not r.future.done()]  # done: given up
            if not batch:
                continue
            try:
                self._place(batch)
            except BaseException as exc:  # this batch's failure; the next batch may fare better
                for request in batch:
                    try:
                        request.future.set_exception(exc)
                    except InvalidStateError:
                        pass  # given up meanwhile, or placed before the failure

    def _take(self) -> list[_Request]:
        """The oldest request and those waiting with its shape (at most the cap); locked."""
        first = self._queue.popleft()
        shape = first.shape()
        batch, rest = [first], deque[_Request]()
        while self._queue and len(batch) < self._cap:
            request = self._queue.popleft()
            (batch if request.shape() == shape else rest).append(request)
        rest.extend(self._queue)
        self._queue = rest
        return batch

    def _requeue(self, requests: list[_Request]) -> None:
        """Put *requests* back at the front (a split batch), in their order."""
        with self._ready:
            self._queue.extendleft(reversed(requests))

    def _place(self, batch: list[_Request]) -> None:
        first = batch[0]
        cluster = self._cluster
        if first.node is not None:
            node, group = first.node, None  # pinned (tests, debugging): no reservation
        else:
            found = self._reserve(batch)
            if found is None:
                return  # split and queued again
            node, group = found
        lease = Lease(group, len(batch))
        try:
            agent = cluster._agent(node)
            opened = agent.open_many.remote([(r.options, r.policy) for r in batch])
        except BaseException:
            for _request in batch:
                lease.release()
            raise
        for index, request in enumerate(batch):
            try:
                request.future.set_result(Placement(node, agent, lease, opened, index))
            except InvalidStateError:  # its caller gave up (cancelled) meanwhile
                agent.close_opened.remote(opened, index)
                lease.release()

    def _reserve(self, batch: list[_Request]) -> tuple[str, Any] | None:
        """One placement group for the whole batch on one node; ``(node, group)``.

        ``None``: the batch was split and queued again (no node had room for
        all of it within :data:`SPLIT_AFTER` seconds).
        """
        from ray.util.placement_group import (
            placement_group,
            placement_group_table,
            remove_placement_group,
        )

        from ._client import NoCapacity

        first, count = batch[0], len(batch)
        bundle: dict[str, float] = {"corral": float(count)}
        if first.cpus:
            bundle["CPU"] = float(first.cpus) * count
        if first.memory:
            bundle["memory"] = float(first.memory) * count
        group = placement_group([bundle], strategy="STRICT_PACK")
        if not group.wait(self._timeout if count == 1 else SPLIT_AFTER):
            remove_placement_group(group)
            if count == 1:
                raise NoCapacity(
                    f"Failed to place the sandbox: no node offered {bundle} within "
                    f"{self._timeout:g} s",
                    hint="add nodes with the 'corral' resource, or ask for less CPU and memory",
                )
            self._cap = max(1, count // 2)  # the next batches are smaller
            self._requeue(batch)
            return None
        try:
            node = placement_group_table(group)["bundles_to_node_id"][0]
        except BaseException:
            remove_placement_group(group)
            raise
        self._cap = min(MAX_BATCH, self._cap * 2)  # room again: grow back
        return node, group
