"""The rules of the restricted Pod Security Standard, checked on a pod spec.

Mirrors https://kubernetes.io/docs/concepts/security/pod-security-standards/ (baseline and
restricted profiles, latest version). `violations` returns one readable line per broken rule,
so a test can assert an empty list and show every problem at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

PodSpec = dict[str, Any]

# Volume types the restricted profile allows.
ALLOWED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
# Sysctls the baseline profile allows.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
ALLOWED_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
ALLOWED_SECCOMP = frozenset({"RuntimeDefault", "Localhost"})
ALLOWED_APPARMOR = frozenset({"RuntimeDefault", "Localhost"})


def pod_spec_of(manifest: dict[str, Any]) -> PodSpec | None:
    """The pod spec inside a workload manifest, or None for kinds without one."""
    kind = manifest.get("kind")
    spec = manifest.get("spec", {})
    if kind == "Pod":
        return dict(spec)
    if kind in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}:
        return dict(spec["template"]["spec"])
    if kind == "CronJob":
        return dict(spec["jobTemplate"]["spec"]["template"]["spec"])
    return None


def _containers(pod: PodSpec) -> Iterator[tuple[str, dict[str, Any]]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod.get(field) or []:
            yield f"{field}[{container.get('name')}]", container


def violations(pod: PodSpec) -> list[str]:
    """Every way `pod` breaks the restricted profile (which includes the baseline)."""
    found: list[str] = []
    pod_sc: dict[str, Any] = pod.get("securityContext") or {}

    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"pod: {field} must be unset or false")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            found.append(f"volume {volume.get('name')}: type {sorted(kinds)} is not allowed")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"pod: sysctl {sysctl.get('name')} is not allowed")
    if pod_sc.get("runAsUser") == 0:
        found.append("pod: runAsUser must not be 0")
    found += _check_common("pod", pod_sc)

    pod_non_root = pod_sc.get("runAsNonRoot") is True
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    for where, container in _containers(pod):
        sc: dict[str, Any] = container.get("securityContext") or {}
        if sc.get("privileged"):
            found.append(f"{where}: privileged must be unset or false")
        if (sc.get("windowsOptions") or {}).get("hostProcess") or (
            (pod_sc.get("windowsOptions") or {}).get("hostProcess")
        ):
            found.append(f"{where}: hostProcess must be unset or false")
        for port in container.get("ports") or []:
            if port.get("hostPort", 0) != 0:
                found.append(f"{where}: hostPort {port['hostPort']} is not allowed")
        if sc.get("procMount", "Default") != "Default":
            found.append(f"{where}: procMount must be Default")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}: allowPrivilegeEscalation must be false")
        non_root = sc.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            found.append(f"{where}: runAsNonRoot must be true (container or pod)")
        if sc.get("runAsUser") == 0:
            found.append(f"{where}: runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ALLOWED_SECCOMP:
            found.append(f"{where}: seccompProfile.type must be RuntimeDefault or Localhost")
        capabilities: dict[str, Any] = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{where}: capabilities.drop must include ALL")
        added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            found.append(f"{where}: capabilities.add may only hold NET_BIND_SERVICE, not {added}")
        found += _check_common(where, sc)
    return found


def _check_common(where: str, sc: dict[str, Any]) -> list[str]:
    """Rules that apply alike to the pod's and to each container's security context."""
    found: list[str] = []
    seccomp = (sc.get("seccompProfile") or {}).get("type")
    if seccomp is not None and seccomp not in ALLOWED_SECCOMP:
        found.append(f"{where}: seccompProfile.type {seccomp} is not allowed")
    apparmor = (sc.get("appArmorProfile") or {}).get("type")
    if apparmor is not None and apparmor not in ALLOWED_APPARMOR:
        found.append(f"{where}: appArmorProfile.type {apparmor} is not allowed")
    selinux: dict[str, Any] = sc.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in ALLOWED_SELINUX_TYPES:
        found.append(f"{where}: seLinuxOptions.type {selinux['type']} is not allowed")
    if selinux.get("user") or selinux.get("role"):
        found.append(f"{where}: seLinuxOptions.user and .role must be unset")
    return found
