import pytest
from tessera.cluster import (
    NETWORK_INTENSIVE,
    Allocation,
    AllocationError,
    Cluster,
    Locality,
    Sensitivity,
)


def test_paper_clusters_sizes() -> None:
    assert len(Cluster.themis_paper("168")) == 168
    assert len(Cluster.themis_paper("256")) == 256
    with pytest.raises(ValueError, match="variant"):
        Cluster.themis_paper("100")


def test_locality_levels() -> None:
    c = Cluster.build([(4, 2)] * 10, machines_per_rack=8)
    assert c.locality([]) == Locality.GPU
    assert c.locality(["m000/0"]) == Locality.GPU
    assert c.locality(["m000/0", "m000/1"]) == Locality.SLOT
    assert c.locality(["m000/0", "m000/2"]) == Locality.MACHINE
    assert c.locality(["m000/0", "m001/0"]) == Locality.RACK
    assert c.locality(["m000/0", "m009/0"]) == Locality.CROSS_RACK


def test_slowdown_defaults_and_network_intensive() -> None:
    c = Cluster.build([(1, 4)] * 9, machines_per_rack=8)
    s = Sensitivity()
    assert c.slowdown(["m000/0", "m000/1"], s) == 1.0
    assert c.slowdown(["m000/0", "m001/1"], s) == 1.1
    assert c.slowdown(["m000/0", "m008/1"], s) == 1.3
    assert c.slowdown(["m000/0", "m001/1"], NETWORK_INTENSIVE) == pytest.approx(1.29)
    with pytest.raises(ValueError, match=r">= 1\.0"):
        Sensitivity(cross_machine=0.5)


def test_allocation_never_double_grants() -> None:
    a = Allocation()
    a.grant("app-a", ["g0", "g1"])
    with pytest.raises(AllocationError, match="already held by app-a"):
        a.grant("app-b", ["g1"])
    assert a.release("app-a", ["g1"]) == {"g1"}
    a.grant("app-b", ["g1"])
    assert a.as_dict() == {"app-a": ["g0"], "app-b": ["g1"]}
    assert a.free(["g0", "g1", "g2"]) == ["g2"]


def test_unknown_gpu_is_a_clear_error() -> None:
    c = Cluster.homogeneous(1, 2)
    with pytest.raises(KeyError, match="unknown GPU"):
        c.gpu("nope")
