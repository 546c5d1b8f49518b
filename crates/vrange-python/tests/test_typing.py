"""The package's type information, as a user of it meets it: the wheel ships the stub and the
py.typed marker, and code written against the stub runs. ci.sh also checks this file with
`mypy --strict` (against the installed package, as a user's checker sees it) and the stub
against the module with `mypy.stubtest`."""

from __future__ import annotations

import importlib.resources

import vrange


def test_the_package_ships_its_stub_and_the_py_typed_marker() -> None:
    files = importlib.resources.files("vrange")
    assert (files / "py.typed").is_file()
    assert (files / "__init__.pyi").is_file()


def test_typed_use_of_the_cache() -> None:
    c = vrange.Cache(slab_bytes=1 << 20, probation=False)
    c["k"] = b"value"
    c.put(b"k2", bytearray(b"v2"), priority="low")
    assert c["k"] == b"value"
    view = c.get(b"k2")  # a bytes key and a str key are different keys
    assert view is not None and bytes(view) == b"v2"
    view.release()
    assert c.get("absent", b"default") == b"default"
    value, how = c.lookup("absent")
    assert value is None and how == "absent"

    def fill(buf: memoryview) -> None:
        buf[:] = b"x" * len(buf)

    made = c.get_or_insert("made", 4, fill, priority="drop_first")
    assert bytes(made) == b"xxxx"
    made.release()
    assert "made" in c and len(c) == 3
    assert c.stats()["entries"] == 3
    del c["made"]
    c.clear()
    assert len(c) == 0


def test_typed_use_of_a_volatile_buffer() -> None:
    b = vrange.VolatileBuffer(4096)
    assert len(b) == 4096 and not b.pinned
    with b.pin() as p:
        m = memoryview(p)
        m[:5] = b"hello"
        assert not p.purged and p.active
        m.release()
    assert not p.active
    assert vrange.purge(1) >= 0


def test_typed_use_of_the_mapping_and_the_decorator() -> None:
    c = vrange.Cache()
    c.update({"a": b"1"})
    c[("t", 2)] = b"2"
    keys: list[str | bytes | tuple[object, ...]] = sorted(c, key=repr)
    assert keys == ["a", ("t", 2)]
    value: bytes = c.pop("a")
    assert value == b"1" and c.setdefault("b", b"3") == b"3"

    @vrange.cached(c, priority="drop_first")
    def render(n: int) -> bytes:
        return b"<p>%d</p>" % n

    page: bytes = render(1)
    assert page == render(1) == b"<p>1</p>"
    info: vrange.CacheInfo = render.cache_info()
    assert info.hits == 1 and info.maxsize is None

    @vrange.cached
    def parse(text: str) -> list[str]:
        return text.split()

    words: list[str] = parse("a b")
    assert words == ["a", "b"]

    class Pages:
        @vrange.cached
        def render(self, n: int) -> bytes:
            return b"<p>%d</p>" % n

    pages = Pages()
    html: bytes = pages.render(2)
    assert html == pages.render(2) and pages.render.cache_info().hits == 1
