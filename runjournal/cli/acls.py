"""``runjournal acls …``: the Kafka ACLs each role needs (least privilege), shown or created."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from runjournal.core.settings import Settings

__all__ = ["acls_app"]

acls_app = typer.Typer(help="The Kafka ACLs each runjournal role needs, for the current topic prefix.",
                       no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)


@acls_app.command("show")
def acls_show(
    role: Annotated[list[str] | None, typer.Option(help="Only this role (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object: role → grants.")] = False,
) -> None:
    """Print each role's grants for RUNJOURNAL_TOPIC_PREFIX (agent, projector, recovery, memory, operator)."""
    from runjournal.deploy.acls import ROLES, grants_for

    prefix = Settings.load().topic_prefix
    unknown = sorted(set(role or []) - set(ROLES))
    if unknown:
        raise typer.BadParameter(f"unknown role(s) {unknown}; roles: {', '.join(ROLES)}", param_hint="--role")
    out = {r: grants_for(r, prefix) for r in (role or list(ROLES))}
    if as_json:
        print(json.dumps(out))
        return
    table = Table("role", "resource", "name", "pattern", "operations", "why")
    for r, grants in out.items():
        for g in grants:
            ops = ", ".join(g["operations"]) if g["permission"] == "ALLOW" else "DENY " + ", ".join(g["operations"])
            table.add_row(r, g["resource"], g["name"], g["pattern"], ops, g["why"])
    console.print(table)


@acls_app.command("create")
def acls_create(
    principal: Annotated[list[str] | None, typer.Option(
        help="ROLE=PRINCIPAL, e.g. agent=User:svc-agent (repeatable); default: every role to User:<role>.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Create the roles' ACLs for RUNJOURNAL_TOPIC_PREFIX, as the configured Kafka user (an ACL administrator).

    Works on any cluster with Kafka's standard authorizer; idempotent.
    """
    from confluent_kafka import KafkaException

    from runjournal.deploy.acls import ROLES, create_acls

    pairs = [p.split("=", 1) for p in principal or []]
    if any(len(p) != 2 or p[0] not in ROLES for p in pairs):
        raise typer.BadParameter(f"expected ROLE=PRINCIPAL with ROLE one of {', '.join(ROLES)}",
                                 param_hint="--principal")
    principals = dict(pairs) if pairs else {r: f"User:{r}" for r in ROLES}  # type: ignore[arg-type]
    settings = Settings.load()
    try:
        count = create_acls(settings, principals)
    except KafkaException as exc:
        err_console.print(f"[bold red]error:[/] the broker refused: {exc.args[0].str()} (creating ACLs needs ALTER on "
                          "the cluster: run as the cluster's administrator)")
        raise typer.Exit(code=1) from exc
    if as_json:
        print(json.dumps({"prefix": settings.topic_prefix, "principals": principals, "bindings": count}))
    else:
        console.print(f"{count} ACL bindings for prefix {settings.topic_prefix}: "
                      + ", ".join(f"{r} → {p}" for r, p in principals.items()))
