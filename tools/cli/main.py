"""The `quire` command.

Verbs follow gazctl (`journals list|apply|…`, `append`, `read -f`, `fragments list`,
`brokers list`) plus `up`, `demo` and `config print`. Role commands — `quire
coordinator`, `quire spark …`, `quire bench` — are not imported here: their packages
declare them in the `quire.commands` entry-point group and they are loaded only when
invoked (so `quire read` never pays for importing a coordinator, and the CLI layer never
depends on a role).

Every failure ends as one line on stderr and an exit code per class of failure
(see tools.cli.common).
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from typing import Any

import typer
from typer import _click as click  # typer >= 0.29 vendors click; its commands are these
from typer.core import TyperGroup

from . import auth, doctor, env, io, jobs, journals, shards, topology, version
from . import fragments_verify  # noqa: F401 - registers `quire fragments verify`
from .common import EXIT_INTERRUPTED, error_line, exit_code_for

ENTRY_POINT_GROUP = "quire.commands"


def _role_commands() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _as_click(name: str, obj: Any) -> click.Command:
    if isinstance(obj, click.Command):
        return obj
    if isinstance(obj, typer.Typer):
        return typer.main.get_command(obj)
    if callable(obj):
        single = typer.Typer()
        single.command(name)(obj)
        return typer.main.get_command(single)
    raise TypeError(f"entry point {name!r} is neither a command nor a callable")


class QuireGroup(TyperGroup):
    """Built-in commands plus role commands from entry points, loaded on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = list(super().list_commands(ctx))
        return names + sorted(n for n in _role_commands() if n not in names)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            return command
        ep = _role_commands().get(name)
        if ep is None:
            return None
        try:
            return _as_click(name, ep.load())
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break `quire --help`
            if ctx.resilient_parsing:
                return None
            raise click.ClickException(f"cannot load command {name!r} ({ep.value}): {exc}") from exc


app = typer.Typer(cls=QuireGroup, name="quire", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False,
                  help="quire: append-only replicated journals, persisted to object storage.")


@app.callback()
def root(ctx: typer.Context,
         broker: str = typer.Option(None, "--broker", envvar="QUIRE_BROKER",
                                    help="Coordinator host:port (comma-separated for several). "
                                         "Default 127.0.0.1:8080."),
         timeout: float = typer.Option(10.0, "--timeout",
                                       help="Seconds to keep retrying an unreachable cluster."),
         token: str = typer.Option(None, "--token", envvar="QUIRE_TOKEN", show_envvar=False,
                                   help="Capability token presented to coordinators "
                                        "(default $QUIRE_TOKEN; see `quire auth token`).")) -> None:
    ctx.obj = {"broker": broker, "timeout": timeout, "token": token}


app.add_typer(journals.app, name="journals")
app.add_typer(shards.app, name="shards")
app.add_typer(jobs.app, name="jobs")
app.add_typer(topology.fragments_app, name="fragments")
app.add_typer(topology.brokers_app, name="brokers")
app.add_typer(topology.config_app, name="config")
app.add_typer(auth.app, name="auth")
app.command("append")(io.append)
app.command("read")(io.read)
app.command("env")(env.env)
app.command("doctor")(doctor.doctor)
app.command("version")(version.version)


@app.command("up")
def up(coordinators: int = typer.Option(1, "--coordinators", "-n", min=1, max=16,
                                        help="How many coordinator processes."),
       store: str = typer.Option(None, "--store", help="Fragment store URL "
                                 "(default file://<data-dir>/fragments/)."),
       data_dir: str = typer.Option(None, "--data-dir", help="Where etcd, spools and the "
                                    "default store live (default: $QUIRE_DATA_DIR or "
                                    "~/.local/share/quire)."),
       flower: bool = typer.Option(False, "--flower", help="Also start Flower."),
       zones: int = typer.Option(1, "--zones", min=1, max=8,
                                 help="Spread coordinators over this many zones."),
       port: int = typer.Option(8080, "--port", help="Listen port of the first coordinator "
                                "(the next ones take the following free ports)."),
       output: str = typer.Option("table", "-o", "--output", help="table or json."),
       tls: bool = typer.Option(False, "--tls", help="Coordinators serve mTLS with a local CA "
                                "and certificate made under <data-dir>/tls/."),
       auth: bool = typer.Option(False, "--auth", help="Coordinators check capability tokens; "
                                 "a key is made under <data-dir>/auth/ and an operator token "
                                 "printed."),
       secure: bool = typer.Option(False, "--secure", help="--auth --tls and every other "
                                   "channel locked: etcd over TLS with client certificates "
                                   "and RBAC, Redis with ACL users over TLS, signed Celery "
                                   "tasks, the dashboard over HTTPS (docs/security.md)."),
       no_restart: bool = typer.Option(False, "--no-restart", help="Leave a member that exits "
                                       "down (default: report it and restart it after a "
                                       "backoff; a crash-looping one is given up on).")) -> None:
    """Run a whole local cluster in the foreground until Ctrl-C or SIGTERM, restarting
    members that exit."""
    from tools.supervisor import run_foreground

    raise typer.Exit(run_foreground(coordinators=coordinators, store=store, data_dir=data_dir,
                                    flower=flower, zones=zones, port=port, output=output, tls=tls,
                                    auth=auth, restart=not no_restart, secure=secure))


@app.command("demo")
def demo(data_dir: str = typer.Option(None, "--data-dir", help="Cluster data directory "
                                      "(default: a fresh temporary one).")) -> None:
    """Start a local cluster, write and read a topic, show persisted fragments, stop."""
    from tools.demo import main as demo_main

    raise typer.Exit(demo_main(data_dir))


def main(argv: list[str] | None = None) -> int:
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="quire", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `quire read … | head`: the reader left, which is not our failure.
        try:
            sys.stdout = open("/dev/null", "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return 0
    except Exception as exc:  # noqa: BLE001 - the one place every error becomes one line
        print(error_line(exc), file=sys.stderr)
        return exit_code_for(exc)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
