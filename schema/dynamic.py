"""Strawberry object types and resolvers made at run time, from store definitions.

Strawberry reads a type from a class's annotations and a resolver's arguments from its signature, so
both are built here with real annotation objects (never strings to evaluate). Python attribute names
of generated types are positional (``f0``, ``f1``…); the GraphQL names are given explicitly, so any
column name works. Types that refer to each other (a relation's entity has the value type that relates
to it as a field) are tied with ``Later``: a reference made before its type, set once the type exists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Optional

import strawberry
from strawberry.types.field import StrawberryField
from strawberry.types.lazy_type import LazyType
from strawberry.types.private import StrawberryPrivate


@dataclass(frozen=True)
class Field:
    """One field of a generated type: its GraphQL name, Python annotation and Strawberry field."""

    name: str
    annotation: Any
    field: StrawberryField


def data_field(name: str, annotation: Any, description: str | None = None) -> Field:
    """Return a field that reads its value from the object (no resolver)."""
    return Field(name, annotation, strawberry.field(name=name, description=description))


def resolved_field(name: str, resolver: Callable[..., Any], description: str | None = None) -> Field:
    """Return a field computed by resolver (built with ``resolver_with``)."""
    annotation = resolver.__annotations__["return"]
    return Field(name, annotation, strawberry.field(resolver=resolver, name=name, description=description))


def object_type(
    name: str,
    fields: Sequence[Field],
    description: str | None = None,
    private: Sequence[str] = (),
    directives: Sequence[object] = (),
) -> type:
    """Return a new Strawberry object type called name with fields, in order.

    private: attributes its objects carry besides the data fields, never shown (keyword arguments too).
    directives: its schema directives (a federation entity's ``@key``).
    """
    namespace: dict[str, Any] = {"__annotations__": {}, "__module__": __name__, "__doc__": description}
    for i, field in enumerate(fields):
        namespace["__annotations__"][f"f{i}"] = field.annotation
        namespace[f"f{i}"] = field.field
    for attribute in private:
        namespace["__annotations__"][attribute] = Annotated[Any, StrawberryPrivate()]
    cls = type(name, (), namespace)
    return strawberry.type(cls, name=name, description=description, directives=directives)


def field_names(cls: type) -> dict[str, str]:
    """Return the Python attribute name of each GraphQL field of a type made by object_type."""
    definition = cls.__strawberry_definition__  # type: ignore[attr-defined]
    return {f.graphql_name: f.python_name for f in definition.fields}


@dataclass(frozen=True)
class Arg:
    """One argument of a generated resolver: its Python parameter name, GraphQL name and type."""

    param: str
    name: str
    annotation: Any
    description: str | None = None


def resolver_with(fn: Callable[..., Any], args: Sequence[Arg], returns: Any) -> Callable[..., Any]:
    """Return fn with the annotations Strawberry reads: info, then args, then the return type.

    fn must take ``(root, info, <arg params>)`` with the parameter names of args; its Python defaults
    are the arguments' defaults in the schema.
    """
    annotations: dict[str, Any] = {"info": strawberry.Info}
    for arg in args:
        annotations[arg.param] = Annotated[
            arg.annotation, strawberry.argument(name=arg.name, description=arg.description)
        ]
    annotations["return"] = returns
    fn.__annotations__ = annotations
    return fn


def list_of(item: Any) -> Any:
    """Return the annotation ``list[item]`` for an item type known only at run time."""
    return list[item]


def optional(item: Any) -> Any:
    """Return the annotation ``Optional[item]`` (a nullable GraphQL type) for a run-time type."""
    return Optional[item]  # noqa: UP045


class Later(LazyType):
    """A reference to a generated type made before the type itself; ``set`` it before the schema is made."""

    def __init__(self, name: str) -> None:
        super().__init__(name, __name__)
        object.__setattr__(self, "target", None)

    def set(self, target: type) -> None:
        """Make the reference point at target."""
        object.__setattr__(self, "target", target)

    def resolve_type(self) -> type[Any]:
        """Return the type referred to (Strawberry asks while it makes the schema)."""
        target: type | None = self.__dict__["target"]
        if target is None:
            raise TypeError(f"type {self.type_name} was referred to but never made")
        return target

    # One reference per type made: two are equal only when they are the same object.
    __eq__ = object.__eq__
    __hash__ = object.__hash__
