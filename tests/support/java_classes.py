"""Read what Java class files in a jar declare and what they name (JVM spec, chapter 4), for binary-compatibility tests.

`declared` reads each class's superclass, interfaces, fields and methods; `named` reads the class, field and method
references of each class's constant pool. No JVM is started: the parse is of the bytes.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

_CLASS, _FIELD, _METHOD, _INTERFACE_METHOD, _NAME_AND_TYPE, _UTF8 = 7, 9, 10, 11, 12, 1
#: The size in bytes of each constant pool entry by tag (Utf8's is its length's); Long and Double take two slots.
_SIZES = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 9: 4, 10: 4, 11: 4, 12: 4, 15: 3, 16: 2, 17: 4, 18: 4, 19: 2, 20: 2}


@dataclass
class JavaClass:
    """What one class file declares: its name, superclass, interfaces and members as (name, descriptor)."""

    name: str
    superclass: str | None
    interfaces: list[str]
    fields: set[tuple[str, str]] = field(default_factory=set)
    methods: set[tuple[str, str]] = field(default_factory=set)


@dataclass(frozen=True)
class Reference:
    """A member one class names: kind "field" or "method", its owner class, name and descriptor."""

    kind: str
    owner: str
    name: str
    descriptor: str


def _pool(data: bytes) -> tuple[dict[int, tuple[int, object]], int]:
    """Return the constant pool (index -> (tag, value)) and the offset just after it."""
    (count,) = struct.unpack_from(">H", data, 8)
    pool: dict[int, tuple[int, object]] = {}
    at, index = 10, 1
    while index < count:
        tag = data[at]
        at += 1
        if tag == _UTF8:
            (length,) = struct.unpack_from(">H", data, at)
            pool[index] = (tag, data[at + 2 : at + 2 + length].decode("utf-8", errors="replace"))
            at += 2 + length
        elif tag == _CLASS:  # the index of its name
            pool[index] = (tag, struct.unpack_from(">H", data, at)[0])
            at += _SIZES[tag]
        elif tag in (_FIELD, _METHOD, _INTERFACE_METHOD, _NAME_AND_TYPE):  # two indexes
            pool[index] = (tag, struct.unpack_from(">HH", data, at))
            at += _SIZES[tag]
        else:  # not read here: skipped
            at += _SIZES[tag]
        index += 2 if tag in (5, 6) else 1
    return pool, at


def _text(pool: dict[int, tuple[int, object]], index: int) -> str:
    return str(pool[index][1])


def _class_name(pool: dict[int, tuple[int, object]], index: int) -> str:
    return _text(pool, int(pool[index][1]))  # type: ignore[call-overload]


def _members(data: bytes, at: int, pool: dict[int, tuple[int, object]]) -> tuple[set[tuple[str, str]], int]:
    (count,) = struct.unpack_from(">H", data, at)
    at += 2
    members = set()
    for _ in range(count):
        _, name, descriptor, attributes = struct.unpack_from(">HHHH", data, at)
        at += 8
        for _ in range(attributes):
            (length,) = struct.unpack_from(">I", data, at + 2)
            at += 6 + length
        members.add((_text(pool, name), _text(pool, descriptor)))
    return members, at


def _classes(jar: Path) -> Iterator[bytes]:
    with zipfile.ZipFile(jar) as archive:
        for entry in archive.namelist():
            if entry.endswith(".class") and not entry.startswith("META-INF/"):
                yield archive.read(entry)


def declared(jar: Path) -> dict[str, JavaClass]:
    """Return every class of jar by its internal name (org/apache/kafka/...), with what it declares."""
    found = {}
    for data in _classes(jar):
        pool, at = _pool(data)
        _, this, superclass, interfaces = struct.unpack_from(">HHHH", data, at)
        at += 8
        names = [_class_name(pool, i) for i in struct.unpack_from(f">{interfaces}H", data, at)]
        at += 2 * interfaces
        java = JavaClass(_class_name(pool, this), _class_name(pool, superclass) if superclass else None, names)
        java.fields, at = _members(data, at, pool)
        java.methods, _ = _members(data, at, pool)
        found[java.name] = java
    return found


def named(jar: Path) -> dict[str, set[Reference]]:
    """Return, per class of jar, the fields and methods its constant pool names (of any class)."""
    found = {}
    for data in _classes(jar):
        pool, at = _pool(data)
        (this,) = struct.unpack_from(">H", data, at + 2)
        references = set()
        for tag, value in pool.values():
            if tag in (_FIELD, _METHOD, _INTERFACE_METHOD):
                owner, name_and_type = value  # type: ignore[misc]
                name, descriptor = pool[name_and_type][1]  # type: ignore[misc]
                kind = "field" if tag == _FIELD else "method"
                references.add(Reference(kind, _class_name(pool, owner), _text(pool, name), _text(pool, descriptor)))
        found[_class_name(pool, this)] = references
    return found


#: Members of the JDK's supertypes (Object, Throwable, Iterable) that a library's classes inherit: a class file
#: declares only its own, so these are taken as there wherever a supertype outside the jar was reached.
JDK_MEMBERS = frozenset(
    {
        ("equals", "(Ljava/lang/Object;)Z"),
        ("hashCode", "()I"),
        ("toString", "()Ljava/lang/String;"),
        ("getMessage", "()Ljava/lang/String;"),
        ("getCause", "()Ljava/lang/Throwable;"),
        ("iterator", "()Ljava/util/Iterator;"),
    }
)


def resolves(classes: dict[str, JavaClass], reference: Reference) -> bool:
    """Return whether reference's member is declared by its owner (a class of classes) or one of its supertypes.

    A constructor must be the owner's own. A supertype outside classes is the JDK's, whose members counted are
    `JDK_MEMBERS` only.
    """
    if reference.owner not in classes:
        return False
    member = (reference.name, reference.descriptor)
    if reference.name == "<init>":
        return member in classes[reference.owner].methods
    pending, seen, reached_jdk = [reference.owner], set(), False
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        java = classes.get(name)
        if java is None:
            reached_jdk = True
            continue
        if member in (java.fields if reference.kind == "field" else java.methods):
            return True
        pending += [*java.interfaces, *([java.superclass] if java.superclass else [])]
    return reached_jdk and reference.kind == "method" and member in JDK_MEMBERS
