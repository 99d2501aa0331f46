"""A network namespace of the test's own, joined to the host by a veth pair, to partition an agent.

Nouns: the *namespace* (``ip netns``) holds one end of a *veth pair* with the *inside address*; the
host keeps the other end with the *host address*; both are the two usable addresses of a private
/30 in ``10.213.0.0/16`` that no interface of the machine uses. A process started with ``run_args``
(``ip netns exec``) sees only the namespace's loopback and that veth, so the only traffic it can
have with the host goes over the pair, and only between those two addresses. ``partition()`` sets
the host's end down (every packet between the two is dropped, the TCP connections stay open on
both sides, as in a real network partition); ``heal()`` sets it up again.

Names are unique per test run (the pid and a random suffix), and ``network_namespace()`` removes
the namespace and the host's end of the pair however the test ends (removing either end removes
both). Needs root and iproute2 (``ip``); ``unavailable()`` says why it cannot run here.

Never: touch an interface, route or namespace it did not create, or send traffic outside the /30.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

PRIVATE_RANGE = ipaddress.IPv4Network("10.213.0.0/16")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (not root, no iproute2), or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (the test creates one with `ip netns add`)"
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A random /30 of PRIVATE_RANGE that overlaps no address on this machine's interfaces."""
    used = []
    for line in _ip("-o", "-4", "addr", "show").stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            used.append(ipaddress.ip_interface(fields[fields.index("inet") + 1]).network)
    subnets = list(PRIVATE_RANGE.subnets(new_prefix=30))
    for _ in range(100):
        candidate = random.choice(subnets)
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise RuntimeError(f"no free /30 in {PRIVATE_RANGE}")


@dataclass(frozen=True)
class NetNamespace:
    name: str
    host_link: str  # the host's end of the veth pair
    inside_link: str  # the namespace's end
    host_address: str  # on host_link: where a server the namespace may reach listens
    inside_address: str  # on inside_link: the namespace's only address besides loopback

    def run_args(self, args: Sequence[str]) -> list[str]:
        """``args`` as a command run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *args]

    def partition(self) -> None:
        """Drop all traffic between the namespace and the host (the host's end of the pair down)."""
        _ip("link", "set", "dev", self.host_link, "down")

    def heal(self) -> None:
        """End the partition."""
        _ip("link", "set", "dev", self.host_link, "up")


class NamespaceUnavailable(RuntimeError):
    """The namespace or its veth pair could not be made here (no CAP_NET_ADMIN/CAP_SYS_ADMIN, no veth)."""


@contextmanager
def network_namespace() -> Iterator[NetNamespace]:
    """A fresh namespace joined to the host by a veth pair (module doc), removed afterwards; raises
    NamespaceUnavailable, having removed what it made, when it cannot be made."""
    tag = f"{os.getpid() % 10000}{uuid.uuid4().hex[:4]}"  # interface names are at most 15 characters
    subnet = _free_subnet()
    host, inside = (str(a) for a in list(subnet.hosts())[:2])
    ns = NetNamespace(name=f"aryl-chaos-{tag}", host_link=f"ach{tag}", inside_link=f"aca{tag}",
                      host_address=host, inside_address=inside)
    try:
        _ip("netns", "add", ns.name)
        _ip("link", "add", ns.host_link, "type", "veth", "peer", "name", ns.inside_link)
        _ip("link", "set", ns.inside_link, "netns", ns.name)
        _ip("addr", "add", f"{host}/30", "dev", ns.host_link)
        _ip("link", "set", "dev", ns.host_link, "up")
        for args in (("addr", "add", f"{inside}/30", "dev", ns.inside_link),
                     ("link", "set", "dev", ns.inside_link, "up"), ("link", "set", "dev", "lo", "up")):
            _ip("-n", ns.name, *args)
    except subprocess.CalledProcessError as exc:
        _ip("link", "del", ns.host_link, check=False)
        _ip("netns", "del", ns.name, check=False)
        raise NamespaceUnavailable(f"`{' '.join(exc.cmd)}` failed: {exc.stderr.strip()}") from exc
    try:
        yield ns
    finally:
        _ip("link", "del", ns.host_link, check=False)  # also removes the inside end
        _ip("netns", "del", ns.name, check=False)
