"""``runjournal acls …``: the Kafka ACLs and Redis ACL rules each role needs (least privilege), shown or created."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from runjournal.cli._tables import folding_table
from runjournal.core.errors import ConfigError

if TYPE_CHECKING:
    from runjournal.core.settings import Settings

__all__ = ["acls_app"]

acls_app = typer.Typer(help="The Kafka ACLs (and, with --redis, the Redis ACL rules) each runjournal role needs, "
                            "for the current topic prefix.", no_args_is_help=True)
console = Console()


RedisOpt = Annotated[bool, typer.Option("--redis", help="Redis ACL rules (key patterns and commands) instead of "
                                                        "Kafka ACLs.")]
AgentNameOpt = Annotated[str | None, typer.Option(
    help="With --redis: limit the agent role's instance keys to this producer_id's instances (one user per agent).")]


@acls_app.command("show")
def acls_show(
    role: Annotated[list[str] | None, typer.Option(help="Only this role (repeatable).")] = None,
    redis: RedisOpt = False,
    agent_name: AgentNameOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object: role → grants.")] = False,
) -> None:
    """Print each role's grants for RUNJOURNAL_TOPIC_PREFIX (agent, projector, recovery, memory, operator, archiver)."""
    from runjournal.core.settings import Settings
    from runjournal.deploy.acls import ROLES, grants_for

    prefix = Settings.load().topic_prefix
    unknown = sorted(set(role or []) - set(ROLES))
    if unknown:
        raise typer.BadParameter(f"unknown role(s) {unknown}; roles: {', '.join(ROLES)}", param_hint="--role")
    if redis:
        _show_redis(role or list(ROLES), prefix, agent_name, as_json)
        return
    out = {r: grants_for(r, prefix) for r in (role or list(ROLES))}
    if as_json:
        print(json.dumps(out))
        return
    table = folding_table("role", "resource", "name", "pattern", "operations", "why")
    for r, grants in out.items():
        for g in grants:
            ops = ", ".join(g["operations"]) if g["permission"] == "ALLOW" else "DENY " + ", ".join(g["operations"])
            table.add_row(r, g["resource"], g["name"], g["pattern"], ops, g["why"])
    console.print(table)


def _show_redis(roles: list[str], prefix: str, agent_name: str | None, as_json: bool) -> None:
    from runjournal.deploy import redis_acls

    _check_agent_name(agent_name, as_json)
    out = {r: {"grants": redis_acls.grants_for(r, prefix, agent_name=agent_name),
               "rules": redis_acls.rules_for(r, prefix, agent_name=agent_name)} for r in roles}
    if as_json:
        print(json.dumps(out))
        return
    table = folding_table("role", "keys", "access", "patterns", "why")
    for r, info in out.items():
        for g in info["grants"]:
            table.add_row(r, g["family"], g["access"], " ".join(g["patterns"]), g["why"])
    console.print(table)
    console.print("ACL SETUSER <user> on ><password> " + "; ".join(
        f"{r}: {' '.join(i['rules'])}" for r, i in out.items()), soft_wrap=True)


def _check_agent_name(agent_name: str | None, as_json: bool) -> None:
    """A bad ``--agent-name`` (empty, whitespace, ``#``: the rules' own check) is a usage error, exit 2."""
    from runjournal.cli._errors import fail
    from runjournal.deploy import redis_acls

    if agent_name is None:
        return
    try:
        redis_acls.rules_for("agent", "probe", agent_name=agent_name)
    except ValueError as exc:
        raise fail(f"--agent-name: {exc}", as_json=as_json, code=2, kind="UsageError") from exc


@acls_app.command("create")
def acls_create(
    principal: Annotated[list[str] | None, typer.Option(
        help="ROLE=PRINCIPAL, e.g. agent=User:svc-agent (repeatable); default: every role to User:<role>. "
             "With --redis: ROLE=USER, e.g. agent=svc-agent (default: every role to the user named like it).")] = None,
    redis: Annotated[bool, typer.Option("--redis", help="Add the roles' Redis ACL rules for the prefix to their "
                                                        "Redis users, on every node, as the configured Redis user "
                                                        "(ACL SETUSER; users are created disabled when missing).")]
    = False,
    agent_name: AgentNameOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Create the roles' ACLs for RUNJOURNAL_TOPIC_PREFIX, as the configured Kafka user (an ACL administrator).

    Works on any cluster with Kafka's standard authorizer; idempotent. With --redis, the Redis rules instead.
    """
    from confluent_kafka import KafkaException

    from runjournal.core.settings import Settings
    from runjournal.deploy.acls import ROLES, create_acls

    pairs = [p.split("=", 1) for p in principal or []]
    if any(len(p) != 2 or p[0] not in ROLES for p in pairs):
        raise typer.BadParameter(f"expected ROLE=PRINCIPAL with ROLE one of {', '.join(ROLES)}",
                                 param_hint="--principal")
    settings = Settings.load()
    if redis:
        _create_redis(settings, dict(pairs) if pairs else {r: r for r in ROLES}, agent_name, as_json)  # type: ignore[arg-type]
        return
    principals = dict(pairs) if pairs else {r: f"User:{r}" for r in ROLES}  # type: ignore[arg-type]
    from runjournal.cli._errors import cli_errors, fail
    from runjournal.consumers.runtime.topic_identity import preflight

    with cli_errors(as_json):  # no broker: named at once (it waited 30 s and blamed the user's rights)
        preflight(settings, need_topic=False, need_redis=False)
    try:
        count = create_acls(settings, principals)
    except KafkaException as exc:
        raise fail(f"the broker refused: {exc.args[0].str()} (creating ACLs needs ALTER on the cluster: run as the "
                   "cluster's administrator)", as_json=as_json, kind="KafkaException") from exc
    if as_json:
        print(json.dumps({"prefix": settings.topic_prefix, "principals": principals, "bindings": count}))
    else:
        console.print(f"{count} ACL bindings for prefix {settings.topic_prefix}: "
                      + ", ".join(f"{r} → {p}" for r, p in principals.items()))


def _create_redis(settings: Settings, users: dict[str, str], agent_name: str | None, as_json: bool) -> None:
    from runjournal.cli._errors import cli_errors
    from runjournal.core import redis_client
    from runjournal.deploy import redis_acls

    _check_agent_name(agent_name, as_json)
    with cli_errors(as_json):  # a refused login or ACL names the settings to check (ConfigError)
        redis_client.check_access(settings)
        admin = redis_client.client(settings)
        try:
            count = redis_acls.grant(admin, users, settings.topic_prefix, agent_name=agent_name)
        except Exception as exc:
            if hint := redis_client.access_problem(exc):
                raise ConfigError(f"Redis refused ACL SETUSER: {exc} — {hint} (creating users needs the "
                                  "administrator)") from exc
            raise
        disabled = _disabled_users(admin, sorted(set(users.values())))
    if as_json:
        print(json.dumps({"prefix": settings.topic_prefix, "users": users, "commands": count, "disabled": disabled}))
    else:
        console.print(f"{count} ACL SETUSER commands for prefix {settings.topic_prefix}: "
                      + ", ".join(f"{r} → {u}" for r, u in users.items()))
        if disabled:  # a user created here has rules and no password: it cannot log in until one is set
            console.print(f"disabled (no password yet): {', '.join(disabled)} — enable each with "
                          "`ACL SETUSER <user> on >PASSWORD` (or `runjournal stack up --secure`, which makes them)",
                          markup=False, highlight=False)


def _disabled_users(admin: Any, users: list[str]) -> list[str]:
    """Users of ``users`` that cannot log in (``off``, or on without a password and without ``nopass``)."""
    from runjournal.core import redis_client

    node = next(iter(redis_client.nodes(admin)))
    out = []
    for user in users:
        info = node.acl_getuser(user) or {}
        flags = set(info.get("flags") or [])
        if "off" in flags or ("nopass" not in flags and not info.get("passwords")):
            out.append(user)
    return out
