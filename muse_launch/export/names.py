"""Where each role lives in the cluster: object names and the stable DNS names the wiring uses.

LeaderWorkerSet: one LWS per role; its pods are `<lws>-<group>` (leader) and `<lws>-<group>-<i>`
(workers) under the LWS's headless Service `<lws>`, so the leader of group 0 is
`<lws>-0.<lws>.<namespace>`: exactly the LWS_LEADER_ADDRESS LWS injects.

RoleBasedGroup (v1alpha2): one RBG named `<deployment>-rbg`, a headless Service `s-<rbg>-<role>` per role that
RBG creates;
a standalone instance's pod is `<rbg>-<role>-<i>`, a leader-worker instance's pods are
`<rbg>-<role>-<i>-<component>`, and RBG_LWP_LEADER_ADDRESS is `<instance>-0.<service>.<namespace>`.

Both flavours of one topology can live in one namespace: the RBG's `-rbg` keeps its pods, Services and
`app.kubernetes.io/instance` label apart from the LeaderWorkerSets' (`<deployment>-<role>-0` would be both's
first pod). They share the Secret `<deployment>-secrets`: the same topology reads the same values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Flavour:
    name: str
    leader_var: str  # the leader's address, injected into every pod of a group
    size_var: str  # pods in the group (leader included)
    index_var: str  # this pod's index in its group (the leader is 0)


LWS = Flavour("lws", "LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")
RBG = Flavour("rbg", "RBG_LWP_LEADER_ADDRESS", "RBG_LWP_GROUP_SIZE", "RBG_LWP_WORKER_INDEX")
FLAVOURS = {f.name: f for f in (LWS, RBG)}

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def dns_label(text: str) -> str:
    """A role or deployment name as a DNS-1035 label part: lowercase, '-' for anything else."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


@dataclass(frozen=True)
class Names:
    flavour: Flavour
    deployment: str  # dns_label of the topology's name
    namespace: str

    @property
    def instance(self) -> str:
        """What every object of this export is named after, and its `app.kubernetes.io/instance` label."""
        return self.deployment if self.flavour is LWS else f"{self.deployment}-rbg"

    def workload(self, role: str) -> str:
        """The LWS or Deployment of a role (LWS flavour); the role's name inside the RBG (RBG flavour)."""
        return f"{self.deployment}-{dns_label(role)}" if self.flavour is LWS else dns_label(role)

    def group_service(self, role: str) -> str:
        """The headless Service that gives the role's pods their DNS names."""
        if self.flavour is LWS:
            return self.workload(role)
        return f"s-{self.instance}-{dns_label(role)}"

    def entry_service(self, role: str) -> str:
        """A router's ClusterIP Service: where clients send requests."""
        return f"{self.instance}-{dns_label(role)}"

    def pod(self, role: str, index: int, group: bool) -> str:
        """Pod `index` of instance 0 of a role; `group`: a leader-worker group (several nodes)."""
        if self.flavour is LWS:
            base = f"{self.workload(role)}-0"
            return base if index == 0 else f"{base}-{index}"
        instance = f"{self.instance}-{dns_label(role)}-0"
        return f"{instance}-{index}" if group else instance

    def address(self, role: str, index: int = 0, group: bool = False) -> str:
        return f"{self.pod(role, index, group)}.{self.group_service(role)}.{self.namespace}"

    def address_template(self, role: str, var: str) -> str:
        """A worker's own address with its index as `$(var)`: `address(role, i, True)` for every i > 0."""
        marker = "\0"
        return (
            self.address(role, 7, group=True).replace("-0-7.", f"-0-{marker}.").replace(marker, f"$({var})")
        )

    def entry_address(self, role: str) -> str:
        return f"{self.entry_service(role)}.{self.namespace}"

    @property
    def secret(self) -> str:
        return f"{self.deployment}-secrets"
