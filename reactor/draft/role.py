"""The runtime role's ``CREATE ROLE``, as ``reactor init --role`` prints it before the grants
(:func:`reactor.install.grants.grant_script`). Pure text."""

from __future__ import annotations


def create_role(role: str) -> str:
    """SQL that creates the login role ``role`` unless it exists; ``role`` is a plain identifier
    (:func:`reactor.install.grants.check_role`), double-quoted as the grants name it."""
    tag = "role"
    while f"${tag}$" in role:
        tag += "_"
    quoted = f'"{role}"'
    return "\n".join(
        [
            f"-- The reactor's runtime role {quoted}: it logs in and holds only the grants below.",
            "-- Give it a password (\\password in psql) or the login your deployment uses; an",
            "-- existing role is kept as it is.",
            f"DO ${tag}$",
            "BEGIN",
            f"    CREATE ROLE {quoted} LOGIN;",
            "EXCEPTION WHEN duplicate_object THEN",
            f"    RAISE NOTICE 'role {role} exists: kept as it is';",
            "END",
            f"${tag}$;",
            "",
        ]
    )
