"""The lab's Job controller and kubelet for batch/v1 Jobs (the bot's `dcgmi diag` Job): a new
Job gets one pod (labels job-name, controller-uid), bound where its template says; about 1 s
later its container "runs": the command's tool from $LAB/bin (the lab's fake dcgmi) on that
node, its output the pod's log (`/log`), its exit code the pod's and then the Job's result
(Complete, or Failed with BackoffLimitExceeded). A tool the lab lacks exits 127. Deleting a
Job orphans its pods unless propagationPolicy says Background or Foreground, as the real API
does; ttlSecondsAfterFinished deletes a finished Job with its pods."""
from __future__ import annotations

import calendar
import logging
import os
import subprocess
import time
from pathlib import Path

from .cluster import Cluster
from .errors import Obj
from .resources import by_kind
from .store import meta, now_iso

log = logging.getLogger("kubeapi")
JOBS, PODS = by_kind("Job"), by_kind("Pod")
RUN_AFTER = 1.0  # seconds from the pod's creation until its container has run
LOG = "lab.gpu-runbook-bot/log"  # the pod's log, kept on the pod (there is no kubelet)
RUN_AT = "lab.gpu-runbook-bot/run-at"


def tick(cluster: Cluster) -> None:
    for job in cluster.store.scan(JOBS):
        status = job.get("status") or {}
        if status.get("completionTime") or _failed(status):
            _expire(cluster, job)
            continue
        pods = cluster.store.scan_owned(PODS, meta(job)["namespace"], meta(job)["uid"])
        if not pods:
            _start(cluster, job)
        elif time.time() >= float(meta(pods[0]).get("annotations", {}).get(RUN_AT, 0)):
            _run(cluster, job, pods[0])


def _failed(status: Obj) -> bool:
    return any(c.get("type") == "Failed" and c.get("status") == "True"
               for c in status.get("conditions") or [])


def _start(cluster: Cluster, job: Obj) -> None:
    m = meta(job)
    template = job["spec"]["template"]
    labels = {**(template.get("metadata", {}).get("labels") or {}), "job-name": m["name"],
              "batch.kubernetes.io/job-name": m["name"], "controller-uid": m["uid"]}
    pod: Obj = {"metadata": {"generateName": f"{m['name']}-", "namespace": m["namespace"],
                             "labels": labels,
                             "annotations": {RUN_AT: f"{time.time() + RUN_AFTER:.3f}"},
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                  "name": m["name"], "uid": m["uid"],
                                                  "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": dict(template["spec"])}
    cluster.create_pod(pod, ready=False)  # its phase comes from _run, not the kubelet tick
    _set_job(cluster, job, {"active": 1, "startTime": now_iso()})


def _run(cluster: Cluster, job: Obj, pod: Obj) -> None:
    container = pod["spec"]["containers"][0]
    argv = [*container.get("command", []), *container.get("args", [])]
    code, output = _execute(cluster, argv, pod["spec"].get("nodeName", ""))
    phase = "Succeeded" if code == 0 else "Failed"

    def finish(p: Obj) -> None:
        meta(p).setdefault("annotations", {})[LOG] = output
        meta(p)["annotations"].pop(RUN_AT, None)
        p.setdefault("status", {})["phase"] = phase
        p["status"]["containerStatuses"] = [{
            "name": container["name"], "image": container.get("image", ""), "ready": False,
            "restartCount": 0, "state": {"terminated": {
                "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                "finishedAt": now_iso()}}}]
    cluster.store.modify(PODS, meta(pod)["namespace"], meta(pod)["name"], finish)
    if code == 0:
        _set_job(cluster, job, {"active": 0, "succeeded": 1, "completionTime": now_iso(),
                                "conditions": [_condition("Complete", "", "")]})
    else:
        _set_job(cluster, job, {"active": 0, "failed": 1, "conditions": [_condition(
            "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")]})
    log.info("job %s/%s: %s (exit %d)", meta(job)["namespace"], meta(job)["name"], phase, code)


def _execute(cluster: Cluster, argv: list[str], node: str) -> tuple[int, str]:
    """The container's command as the lab can run it: its tool from $LAB/bin on ``node``."""
    if not argv or cluster.faults_dir is None:
        return 127, "exec: no command\n"
    tool = cluster.faults_dir.parent / "bin" / Path(argv[0]).name
    if not tool.exists():
        return 127, f'exec: "{argv[0]}": executable file not found in $PATH\n'
    done = subprocess.run([str(tool), *argv[1:]], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LAB_NODE": node}, check=False)
    return done.returncode, done.stdout + done.stderr


def _condition(kind: str, reason: str, message: str) -> Obj:
    found: Obj = {"type": kind, "status": "True", "lastProbeTime": now_iso(),
                  "lastTransitionTime": now_iso()}
    if reason:
        found.update(reason=reason, message=message)
    return found


def _set_job(cluster: Cluster, job: Obj, status: Obj) -> None:
    def change(j: Obj) -> None:
        j["status"] = {**(j.get("status") or {}), **status}
    cluster.store.modify(JOBS, meta(job)["namespace"], meta(job)["name"], change)


def _expire(cluster: Cluster, job: Obj) -> None:
    ttl = job["spec"].get("ttlSecondsAfterFinished")
    if ttl is None:
        return
    conditions = (job.get("status") or {}).get("conditions") or [{}]
    ended = str(conditions[-1].get("lastTransitionTime", ""))[:19]
    if ended and time.time() - calendar.timegm(time.strptime(ended, "%Y-%m-%dT%H:%M:%S")) \
            >= float(ttl):
        delete_dependents(cluster, job, "Background")
        cluster.store.delete(JOBS, meta(job)["namespace"], meta(job)["name"])


def delete_dependents(cluster: Cluster, job: Obj, policy: str | None) -> None:
    """A deleted Job's pods: deleted with Background or Foreground, orphaned otherwise."""
    if policy not in ("Background", "Foreground"):
        return
    for pod in cluster.store.scan_owned(PODS, meta(job)["namespace"], meta(job)["uid"]):
        cluster.store.delete(PODS, meta(pod)["namespace"], meta(pod)["name"])
