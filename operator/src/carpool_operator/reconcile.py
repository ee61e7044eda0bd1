"""Bring a BatchedModel's children and status in line with its spec, writing only the difference."""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import kopf

from carpool_operator.adoption import adoptable, collected
from carpool_operator.autoscaling_status import dependency_conditions
from carpool_operator.cache import Cache
from carpool_operator.defaults import Defaults
from carpool_operator.diff import up_to_date, with_digest
from carpool_operator.handover import hand_over_replicas
from carpool_operator.kube import FIRST_RETRY_S, ApiError, KubeClient
from carpool_operator.locks import Locks
from carpool_operator.merge_keys import refuse_duplicates
from carpool_operator.metrics import OperatorMetrics
from carpool_operator.names import KIND
from carpool_operator.pods import pod_problem
from carpool_operator.preconditions import ModelGone, as_judged, require_live
from carpool_operator.refusals import Refusals
from carpool_operator.render import render_spec, selector_for, service_url
from carpool_operator.spec import ModelSpec, SpecError, parse
from carpool_operator.status import Observation, desired_status, merge_conditions, observe
from carpool_operator.triggers import Triggers
from carpool_operator.types import Manifest

# Kinds rendered only under some specs; an owned leftover of these is deleted.
OPTIONAL_KINDS = ("PodDisruptionBudget", "HorizontalPodAutoscaler", "PodMonitor")
# The most of an API server's message a condition repeats.
MESSAGE_LIMIT = 2048


@dataclass
class Runtime:
    """What the handlers share, kept in kopf's memo."""

    defaults: Defaults
    metrics: OperatorMetrics
    kube: KubeClient
    # One reconcile per object at a time: a BatchedModel's own handlers and its children's
    # events may fire together, and two concurrent creates would collide.
    locks: Locks = field(default_factory=Locks)
    # The watches' cache the reads come from (started at login) and the reconciles its events
    # ask for; the periodic resync (see resync.py), started at start-up. Each is stopped at
    # cleanup.
    cache: Cache | None = None
    triggers: Triggers | None = None
    resync: asyncio.Task[None] | None = None
    refusals: Refusals = field(default_factory=Refusals)


def _owned_by(child: Mapping[str, Any], uid: str) -> bool:
    refs = child.get("metadata", {}).get("ownerReferences", [])
    return any(ref.get("uid") == uid for ref in refs)


def _retry(error: ApiError, retry: int) -> kopf.TemporaryError | kopf.PermanentError:
    """kopf's retry of the handler: later and later while the error may pass, never if not."""
    if not error.transient:
        return kopf.PermanentError(f"API server: {error}")
    return kopf.TemporaryError(f"API server: {error}", delay=error.retry_delay(retry))


def _rejected(kind: str, name: str, message: str) -> SpecError:
    if len(message) > MESSAGE_LIMIT:
        message = message[:MESSAGE_LIMIT] + "..."
    return SpecError("Rejected", f"the API server refused {kind} {name}: {message}")


async def _apply(
    kube: KubeClient, refusals: Refusals, owner: Manifest, rendered: Manifest, spec: ModelSpec
) -> None:
    manifest = with_digest(rendered)
    kind, metadata = manifest["kind"], manifest["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    cached = await kube.get(kind, namespace, name)
    if (refused := refusals.of(spec.name, manifest, cached)) is not None:
        raise _rejected(kind, name, refused)
    # Not in the cache: about to be created, unless an object without carpool's label (which
    # the cache's watches leave out) already has the name, so ask the API server once.
    actual = cached or await kube.fetch(kind, namespace, name)
    try:
        await _judge_and_apply(kube, refusals, owner, manifest, spec, actual)
    except ApiError as error:
        if error.status != 409 or actual is None:
            raise
        # Someone wrote the child since the cache heard of it (preconditions.py): judged once
        # more as the API server has it, so a watch that lags costs a read, not a retry.
        fresh = await kube.fetch(kind, namespace, name)
        await _judge_and_apply(kube, refusals, owner, manifest, spec, fresh)


async def _judge_and_apply(
    kube: KubeClient,
    refusals: Refusals,
    owner: Manifest,
    manifest: Manifest,
    spec: ModelSpec,
    actual: Manifest | None,
) -> None:
    """Apply `manifest` over `actual` (None: there is none), as what that child is allows."""
    kind, metadata = manifest["kind"], manifest["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    if actual is None:
        news = "ChildCreated", f"created {kind} {name}"
    elif _owned_by(actual, spec.uid):
        if up_to_date(actual, manifest):
            return
        news = "ChildUpdated", f"updated {kind} {name}"
    elif adoptable(actual, manifest):
        # Unless this very model's orphaning delete left it so (see preconditions.py).
        await require_live(kube, owner)
        news = "ChildAdopted", f"adopted {kind} {name}, which an earlier {spec.name} left"
    elif collected(actual, manifest):
        # Its deletion (a watch event) asks for the next reconcile; kopf's retry is the backstop.
        message = f"{kind} {name} of the deleted {spec.name} is not collected yet"
        raise kopf.TemporaryError(message, delay=FIRST_RETRY_S)
    else:
        raise SpecError("NameConflict", f"{kind} {name} exists and belongs to someone else")
    handed = None
    if actual is not None:
        actual, handed = await hand_over_replicas(kube, actual, manifest)
    try:
        await kube.apply(as_judged(manifest, actual))
    except ApiError as error:
        if error.transient:
            raise
        # Against the child as the apply found it: the hand-over may have just changed it.
        now = await kube.get(kind, namespace, name)
        refusals.refused(spec.name, manifest, now, error.message)
        raise _rejected(kind, name, error.message) from error
    refusals.accepted(spec.name, manifest)
    await kube.post_event(owner, *news, warning=False)
    if handed is not None:
        await kube.post_event(owner, *handed, warning=False)


async def _prune(kube: KubeClient, owner: Manifest, spec: ModelSpec, kinds: set[str]) -> None:
    for kind in OPTIONAL_KINDS:
        if kind in kinds:
            continue
        try:
            actual = await kube.get(kind, spec.namespace, spec.name)
        except ApiError as error:
            if error.status == 403:
                continue  # RBAC for a kind no spec uses is optional (docs/operator.md)
            raise
        if await _delete_if_owned(kube, kind, spec, actual):
            message = f"deleted {kind} {spec.name}"
            await kube.post_event(owner, "ChildDeleted", message, warning=False)


async def _delete_if_owned(
    kube: KubeClient, kind: str, spec: ModelSpec, actual: Manifest | None
) -> bool:
    """Delete the child if `actual` is the model's, only as judged: a child written since
    the cache heard of it (orphaned, say: then it is the user's) is judged once more as the
    API server has it. True if this call deleted it: a child the cache still holds may be
    gone already (a watch event from before its delete arrived after it)."""
    if actual is None or not _owned_by(actual, spec.uid):
        return False
    try:
        return await kube.delete(kind, spec.namespace, spec.name, judged=actual)
    except ApiError as error:
        if error.status != 409:
            raise
        fresh = await kube.fetch(kind, spec.namespace, spec.name)
        if fresh is None or not _owned_by(fresh, spec.uid):
            return False
        return await kube.delete(kind, spec.namespace, spec.name, judged=fresh)


async def _children(runtime: Runtime, body: Manifest, spec: ModelSpec) -> None:
    kube = runtime.kube
    podmonitor_api = spec.pod_monitor and await kube.serves("PodMonitor")
    manifests = render_spec(spec, podmonitor_api=podmonitor_api)
    refuse_duplicates(manifests)
    try:
        # Pruning first: an HPA being switched off is gone before carpool takes replicas back.
        await _prune(kube, body, spec, {manifest["kind"] for manifest in manifests})
        for manifest in manifests:
            await _apply(kube, runtime.refusals, body, manifest, spec)
    except ApiError as error:
        if error.status != 403:
            raise
        # The spec asks for a kind the operator's RBAC leaves out: retrying will not help
        # until an admin grants it; the API server's message names the kind and the verb.
        raise SpecError("Forbidden", error.message) from error


def _clamp_news(current: Mapping[str, Any], wanted: Manifest, applied: ModelSpec) -> bool:
    """Whether this status write is the first to report a clamped batch size for this spec.

    Said once per spec generation (or change of the effective size): a resync or a rollout's
    progress rewrites the status without repeating the warning.
    """
    if not applied.batch_size_clamped:
        return False
    before = current.get("batching", {}).get("maxBatchSize")
    new_generation = current.get("observedGeneration") != wanted["observedGeneration"]
    return bool(new_generation or before != wanted["batching"]["maxBatchSize"])


async def _status(
    kube: KubeClient, body: Manifest, applied: ModelSpec | None, error: SpecError | None
) -> Observation:
    """Write the status if it changed; `applied` is the spec whose children were applied."""
    metadata = body["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    generation = int(metadata.get("generation", 0))
    deployment = await kube.get("Deployment", namespace, name)
    if deployment is not None and not _owned_by(deployment, metadata.get("uid", "")):
        deployment = None
    problem = None
    if deployment is not None:
        problem = pod_problem(await kube.select("Pod", namespace, selector_for(name)))
    fewest = applied.fewest_replicas if applied is not None else None
    observation = observe(deployment, error, pods=problem, fewest=fewest)
    if applied is not None:
        extra = await dependency_conditions(kube, applied)
        observation = replace(observation, conditions=observation.conditions + extra)
    current = body.get("status", {})
    conditions, flipped = merge_conditions(
        current.get("conditions", []),
        observation.conditions,
        generation,
        datetime.datetime.now(datetime.UTC),
    )
    url = service_url(applied) if applied is not None else str(current.get("url", ""))
    # The settings the sidecars run with: those of the last spec that was applied.
    batching = applied.sidecar_batching.as_file() if applied is not None else None
    wanted = desired_status(
        observation, conditions, generation=generation, url=url, batching=batching
    )
    if all(current.get(key) == value for key, value in wanted.items()):
        return observation
    await kube.merge_patch(KIND, namespace, name, {"status": wanted}, subresource="status")
    if applied is not None and _clamp_news(current, wanted, applied):
        limit = applied.model_max_batch_size
        message = (
            f"batching.maxBatchSize {applied.batching.max_batch_size} (the spec's or the "
            f"operator's default) exceeds spec.model.maxBatchSize {limit}: the sidecars send "
            f"batches of at most {limit}"
        )
        await kube.post_event(body, "BatchSizeClamped", message, warning=True)
    had = {item.get("type") for item in current.get("conditions", [])}
    for condition in flipped:
        if condition.type == "Degraded" and condition.type not in had and not condition.status:
            continue  # "not degraded" on creation is no news
        unwelcome = condition.status == (condition.type == "Degraded")
        message = f"{condition.type}: {condition.message}"
        warning = unwelcome and condition.type != "Progressing"
        await kube.post_event(body, condition.reason, message, warning=warning)
    return observation


async def _converge(
    runtime: Runtime, namespace: str, name: str, logger: kopf.Logger, retry: int
) -> Observation | None:
    """One pass over one BatchedModel; None when it is gone or going."""
    kube = runtime.kube
    try:
        body = await kube.get(KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            raise ModelGone(name)
        applied: ModelSpec | None = None
        error: SpecError | None = None
        try:
            spec = parse(body, defaults=runtime.defaults)
            await _children(runtime, body, spec)
            applied = spec
        except SpecError as problem:
            # Retrying cannot fix a spec, nor a child the API server refuses; the status (and
            # one event) say what is wrong until it changes, so each resync need not repeat it
            # above debug level.
            logger.debug(f"cannot realise {namespace}/{name}: {problem.message}")
            error = problem
        return await _status(kube, body, applied, error)
    except ModelGone:
        runtime.refusals.forget(namespace, name)
        return None  # garbage collection removes the children, or the user keeps them
    except ApiError as problem:
        raise _retry(problem, retry) from problem


def _condition(observation: Observation, kind: str) -> bool:
    return any(item.status for item in observation.conditions if item.type == kind)


async def reconcile(
    runtime: Runtime, namespace: str, name: str, logger: kopf.Logger, retry: int = 0
) -> None:
    """Level-triggered: read the BatchedModel afresh, then fix its children and status.

    `retry`: kopf's count of this handler's failures in a row, which lengthens the next wait.
    """
    metrics = runtime.metrics
    async with runtime.locks.hold((namespace, name)):
        started = time.monotonic()
        try:
            observation = await _converge(runtime, namespace, name, logger, retry)
        except Exception:
            metrics.reconciled("error", time.monotonic() - started)
            raise
        if observation is None:
            metrics.forget(namespace, name)
            result = "success"
        else:
            metrics.saw(namespace, name, ready=_condition(observation, "Ready"))
            result = "degraded" if _condition(observation, "Degraded") else "success"
        metrics.reconciled(result, time.monotonic() - started)
