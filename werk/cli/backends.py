"""``werk backends``: the managed Python environments heavy backends run in.

Plugins describe them (``werk_backend_environments``); the host installs them under
``WERK_HOME/backends/<name>/`` (:mod:`werk.environments`).
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

import typer

from ..protocol import InvalidRequest
from ._app import app
from ._output import emit_json, print_table, reporting_errors

if TYPE_CHECKING:
    from ..environments import EnvironmentSpec, InstallStep
    from ..plugins import WerkPluginManager

backends_app = typer.Typer(
    help="Managed Python environments for backends that need their own (vLLM, media workers): "
    "list them and install them under WERK_HOME/backends/<name>/venv.",
    no_args_is_help=True,
)
app.add_typer(backends_app, name="backends")


def environment_specs(pm: WerkPluginManager) -> dict[str, tuple[str, EnvironmentSpec]]:
    """Every plugin's environment specs by name, with the plugin offering it.

    :raises werk.InvalidRequest: two plugins describe the same environment name.
    """
    from ..environments import EnvironmentSpec

    return pm.offers(
        "werk_backend_environments", EnvironmentSpec, lambda spec: spec.name, "environment"
    )


def _requirements(spec: EnvironmentSpec) -> list[str]:
    """What the environment installs; a wheel built from source says so."""
    built = [f"{wheel.requirement()} (built from source)" for wheel in spec.source_wheels]
    return [*spec.requirements, *built]


@backends_app.command("list")
def list_environments(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the environments the installed plugins describe, and whether each is installed."""
    from ..config import werk_home
    from ..environments import ManagedEnvironment
    from ..plugins import get_plugin_manager

    with reporting_errors(as_json):
        specs = environment_specs(get_plugin_manager())
        home = werk_home()
        found = [
            (name, plugin, spec, ManagedEnvironment(home, name).status(spec))
            for name, (plugin, spec) in sorted(specs.items())
        ]
    if as_json:
        emit_json(
            {
                "environments": [
                    {
                        "name": name,
                        "plugin": plugin,
                        "state": status.state.value,
                        "path": str(status.path),
                        "installed_at": status.installed_at,
                        "requirements": _requirements(spec),
                        "detail": status.detail,
                    }
                    for name, plugin, spec, status in found
                ]
            }
        )
        return
    if not found:
        typer.echo("No installed plugin needs a managed environment.")
        return
    print_table(
        "Backend environments",
        ["NAME", "PLUGIN", "STATE", "REQUIREMENTS", "DETAIL"],
        [
            (name, plugin, status.state.value, " ".join(_requirements(spec)), status.detail)
            for name, plugin, spec, status in found
        ],
    )


_BUILD_STEP = re.compile(r"^\[\s*(\d+)\s*/\s*(\d+)\s*\]")
_SAID_IN_LOGS = ("building ", "reusing ", "built ")  # a source wheel's own lines


class _StepPrinter:
    """One line per step, and the current pip line redrawn in place on a terminal; elsewhere (a
    log) a source build's ``[n/N]`` progress once per tenth, so a long build is not silent."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.width = 0
        self.tenth = -1

    def __call__(self, step: InstallStep) -> None:
        if step.line is None:
            self._clear()
            self.tenth = -1
            typer.echo(f"[{step.index}/{step.total}] {step.label}", err=True)
        elif self.tty:
            text = f"      {step.line}"[:100]
            sys.stderr.write("\r" + text.ljust(self.width))
            sys.stderr.flush()
            self.width = len(text)
        else:
            built = _BUILD_STEP.match(step.line)
            tenth = int(built.group(1)) * 10 // max(1, int(built.group(2))) if built else -1
            if tenth > self.tenth or step.line.startswith(_SAID_IN_LOGS):
                self.tenth = max(tenth, self.tenth)
                typer.echo(f"      {step.line[:200]}", err=True)

    def _clear(self) -> None:
        if self.tty and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            self.width = 0

    def done(self) -> None:
        self._clear()


@backends_app.command("install")
def install(
    name: str = typer.Argument(
        ..., metavar="NAME", help="The environment (see `werk backends list`)."
    ),
    force: bool = typer.Option(
        False, "--force", help="Rebuild NAME even when it is installed and current."
    ),
    if_needed: bool = typer.Option(
        True,
        "--if-needed",
        hidden=True,
        help="Kept for scripts: doing nothing for a current environment is the default.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Create the managed environment NAME (or replace one that is missing, outdated or
    broken): a new virtual environment, pip install, removals, an import check, then an atomic
    switch. An environment that is installed and current is left alone (--force rebuilds it).
    Steps are shown as they run; pip's full output goes to WERK_HOME/backends/NAME/install.log.
    A failure leaves the previous environment in place."""
    from ..config import werk_home
    from ..environments import EnvironmentState, ManagedEnvironment
    from ..plugins import get_plugin_manager

    printer = _StepPrinter()
    current = False
    with reporting_errors(as_json):
        specs = environment_specs(get_plugin_manager())
        if name not in specs:
            known = ", ".join(sorted(specs)) or "none"
            raise InvalidRequest(
                f"no installed plugin describes environment {name!r} (known: {known})"
            )
        environment = ManagedEnvironment(werk_home(), name)
        status = environment.status(specs[name][1])
        current = status.state is EnvironmentState.READY and not force
        if not current:
            try:
                status = environment.install(specs[name][1], progress=printer)
            finally:
                printer.done()
    if as_json:
        emit_json(
            {
                "name": name,
                "state": status.state.value,
                "path": str(status.path),
                "distributions": dict(status.distributions),
            }
        )
        return
    if current:
        typer.echo(
            f"{name} is installed and current in {status.path} "
            f"({len(status.distributions)} distributions); --force rebuilds it"
        )
        return
    typer.echo(f"installed {name} in {status.path} ({len(status.distributions)} distributions)")
