"""skyjax.cluster.network: the transfer server's address (route to the coordinator, precedence of
key / variable / route / default) and its port range (parsing, leases past used ports)."""

from __future__ import annotations

import socket

import pytest

from skyjax.cluster import network

ENV = "SKYJAX_TRANSFER_HOST"


def test_route_to_a_loopback_coordinator_is_loopback():
    assert network.route_address("127.0.0.1:1234") == "127.0.0.1"
    assert network.route_address("localhost:1234") in ("127.0.0.1", "::1")


def test_no_route_without_a_coordinator_or_to_a_name_that_does_not_resolve():
    assert network.route_address(None) is None
    assert network.route_address("") is None
    assert network.route_address("no-such-host.invalid:1234") is None
    assert network.route_address("not-an-address") is None


def test_route_to_a_non_loopback_address_leaves_by_a_real_interface():
    """A UDP connect() sends nothing, so it works for any routable address; the source address
    it picks is this host's own (not loopback) when a default route exists."""
    got = network.route_address("192.0.2.1:9")  # TEST-NET-1: routed, never answered
    if got is None:
        pytest.skip("no default route on this host")
    assert got != "127.0.0.1"
    with socket.socket() as s:
        s.bind((got, 0))  # an address of this host


def test_host_precedence_key_then_variable_then_route_then_default():
    coordinator = "127.0.0.1:4321"
    assert network.transfer_host("10.9.8.7", coordinator, {ENV: "10.1.1.1"}) == (
        "10.9.8.7", "config.cluster.transfer_host")
    assert network.transfer_host("", coordinator, {ENV: "10.1.1.1"}) == (
        "10.1.1.1", "$SKYJAX_TRANSFER_HOST")
    host, source = network.transfer_host("", coordinator, {ENV: ""})
    assert host == "127.0.0.1" and "route to the coordinator 127.0.0.1:4321" in source
    assert network.transfer_host("", None, {}) == ("127.0.0.1", "the default")
    assert network.transfer_host("", "no-such-host.invalid:1", {}) == ("127.0.0.1", "the default")


@pytest.mark.parametrize("spec, expected", [
    ("", None), ("  ", None), ("40000-40100", range(40000, 40101)), ("40000", range(40000, 40001)),
    (" 5000 - 5001 ", range(5000, 5002))])
def test_port_range_parses(spec, expected):
    assert network.parse_port_range(spec, "config.cluster.transfer_ports") == expected


@pytest.mark.parametrize("spec, message", [
    ("40000:40100", "must be 'FIRST-LAST'"), ("a-b", "must be 'FIRST-LAST'"),
    ("-5", "must be 'FIRST-LAST'"), ("40100-40000", "1 <= FIRST <= LAST <= 65535"),
    ("0-10", "1 <= FIRST"), ("65000-70000", "<= 65535")])
def test_bad_port_ranges_name_the_key(spec, message):
    with pytest.raises(ValueError) as info:
        network.parse_port_range(spec, "config.cluster.transfer_ports")
    assert str(info.value).startswith(f"config.cluster.transfer_ports={spec!r}")
    assert message in str(info.value)


def test_port_range_key_wins_over_the_variable():
    env = {"SKYJAX_TRANSFER_PORTS": "50000-50010"}
    assert network.port_range("40000-40001", env) == (
        range(40000, 40002), "40000-40001", "config.cluster.transfer_ports")
    assert network.port_range("", env) == (
        range(50000, 50011), "50000-50010", "$SKYJAX_TRANSFER_PORTS")
    assert network.port_range("", {}) == (None, "", "$SKYJAX_TRANSFER_PORTS")


def two_free_ports() -> int:
    """p with p and p + 1 both free on loopback a moment ago."""
    for _ in range(50):
        p = network.free_port()
        if p < 65535 and network.bindable("127.0.0.1", p + 1):
            return p
    pytest.skip("no two adjacent free ports")


def test_a_lease_skips_a_port_in_use_and_the_range_runs_out():
    p = two_free_ports()
    ports = range(p, p + 2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", p))
        busy.listen()
        leases = network.port_leases("127.0.0.1", ports, f"{p}-{p + 1}", "config.cluster."
                                     "transfer_ports")
        lease = next(leases)
        assert lease.ports == [p + 1]
        # p + 1 is locked while the lease lives: a second server on this node skips it too.
        again = network.port_leases("127.0.0.1", ports, f"{p}-{p + 1}",
                                    "config.cluster.transfer_ports")
        with pytest.raises(RuntimeError) as info:
            next(again)
        assert str(info.value).startswith(f"config.cluster.transfer_ports='{p}-{p + 1}': no "
                                          "free port left")
        lease.release()
        again = next(network.port_leases("127.0.0.1", ports, "", "x"))
        assert again.ports == [p + 1]
        again.release()
