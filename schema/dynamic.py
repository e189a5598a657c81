"""Strawberry object types and resolvers made at run time, from store definitions.

Strawberry reads a type from a class's annotations and a resolver's arguments from its signature, so
both are built here with real annotation objects (never strings to evaluate). Python attribute names
of generated types are positional (``f0``, ``f1``…); the GraphQL names are given explicitly, so any
column name works.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Optional

import strawberry
from strawberry.types.field import StrawberryField


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


def object_type(name: str, fields: Sequence[Field], description: str | None = None) -> type:
    """Return a new Strawberry object type called name with fields, in order."""
    namespace: dict[str, Any] = {"__annotations__": {}, "__module__": __name__, "__doc__": description}
    for i, field in enumerate(fields):
        namespace["__annotations__"][f"f{i}"] = field.annotation
        namespace[f"f{i}"] = field.field
    cls = type(name, (), namespace)
    return strawberry.type(cls, name=name, description=description)


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
