"""What every `tea` command shows on the terminal (docs/cli.md): help that reads the same for every command, a
user error as one `error:` line on stderr (bad option values and file-system errors included), and progress
on stderr that appears with the first report: a rich bar on a terminal, plain lines elsewhere.

Below the commands of teacli/cli.py; imports typer and rich only (rich inside the bar, at its first report).
"""

from __future__ import annotations

import errno
import inspect
import os
from typing import Any, NoReturn, Optional

import typer
import typer.core


class Group(typer.core.TyperGroup):
    """Help that reads the same for every command, whoever adds it: flags are shown as `--force`
    (not `--force <bool>`) and positional arguments in capitals (`RECIPE`, `[RUN_DIR]...`)."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            _tidy_params(cmd, ctx)
        return cmd

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _tidy_params(self, ctx)
        super().format_help(ctx, formatter)

    def invoke(self, ctx: Any) -> Any:
        """Every command: a file-system error (a full disk, a read-only or unwritable directory, a file where a
        directory should be) is one `error:` line naming the path, exit 2, not a traceback."""
        try:
            return super().invoke(ctx)
        except typer.BadParameter as exc:  # typer's click (vendored in typer >= 0.24)
            if any(c.__name__ == "MissingParameter" for c in type(exc).__mro__):  # syntax: keeps the usage line (docs/cli.md)
                raise
            fail(bad_parameter_message(exc))  # a value out of range or of the wrong type: bad input, one line
        except OSError as exc:
            if exc.errno not in _FS_HINTS:
                raise
            fail(os_error_message(exc))


_FULL = "free space there (or write elsewhere) and run the command again"
_FS_HINTS = {
    errno.ENOSPC: _FULL, errno.EDQUOT: _FULL, errno.EFBIG: "",
    errno.EROFS: "write elsewhere", errno.EACCES: "check its permissions, or write elsewhere",
    errno.EPERM: "check its permissions and attributes (e.g. lsattr: immutable), or write elsewhere",
    errno.ENOTDIR: "", errno.EISDIR: "", errno.EEXIST: "", errno.ENOENT: "", errno.ENAMETOOLONG: "",
}


def bad_parameter_message(exc: Any) -> str:
    """click's BadParameter as one line: `--steps: input should be greater than or equal to 1`."""
    param = exc.param
    name = exc.param_hint if isinstance(exc.param_hint, str) else None
    if name is None and param is not None:
        name = param.opts[0] if getattr(param, "opts", None) and param.param_type_name == "option" else (param.human_readable_name or param.name)
    message = " ".join(str(exc.message).split())
    return f"{name or 'an option'}: {message[:1].lower()}{message[1:]}"


def os_error_message(exc: OSError) -> str:
    """A file-system error as one line: the path, what happened and what to do (a path in tea's cache names TEA_CACHE)."""
    what = (exc.strerror or str(exc)).rstrip(".")
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    head = f"{' -> '.join(paths)}: {what[:1].lower()}{what[1:]}" if paths else what
    from teacli.cache import cache_dir, cache_setting

    cache = cache_setting()
    if cache and any(_under(p, str(cache_dir())) for p in paths):  # the user's setting made that path: name it
        return f"{head}; it is in tea's cache, TEA_CACHE={cache}: set TEA_CACHE to a directory tea can create and write (or unset it for ~/.cache/tea)"
    return f"{head}; {_FS_HINTS[exc.errno]}" if _FS_HINTS.get(exc.errno) else head


def _under(path: str, root: str) -> bool:
    a, b = os.path.abspath(os.path.expanduser(path)), os.path.abspath(os.path.expanduser(root))
    return a == b or a.startswith(b.rstrip(os.sep) + os.sep)


def _tidy_params(cmd: Any, ctx: Any) -> None:
    if cmd.help:
        cmd.help = _unwrap_paragraphs(cmd.help)
    for param in cmd.get_params(ctx):  # includes the help option
        if getattr(param, "is_flag", False):
            param.metavar = ""
        elif param.param_type_name == "argument" and param.metavar is None:
            param.metavar = param.name.upper()


def _unwrap_paragraphs(text: str) -> str:
    """A docstring's paragraphs as single lines, for the terminal to wrap: typer's rich help keeps the
    source's line breaks inside a paragraph, which breaks sentences mid-line on a wide terminal. A paragraph
    that starts with click's no-rewrap marker `\\b` or holds a list (`- item` lines) keeps its lines."""
    head, sep, tail = inspect.cleandoc(text).partition("\f")
    paragraphs = []
    for paragraph in head.split("\n\n"):
        lines = paragraph.splitlines()
        keep = paragraph.startswith("\b") or any(line.lstrip().startswith(("- ", "* ")) for line in lines)
        paragraphs.append(paragraph if keep else " ".join(line.strip() for line in lines))
    return "\n\n".join(paragraphs) + sep + tail


def color() -> Optional[bool]:
    """False when NO_COLOR is set (https://no-color.org): click's echo does not read it, rich does."""
    return False if os.environ.get("NO_COLOR") else None


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a one-line error to stderr and exit (no traceback for user errors)."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True, color=color())
    raise typer.Exit(code)


def only_with(ctx: Any, flag: str, names: tuple[str, ...]) -> None:
    """One `error:` line when an option that only applies with `flag` (e.g. --estimate) was given without it:
    it would be ignored silently otherwise."""
    given = []
    for name in names:
        source = ctx.get_parameter_source(name)  # click's (or typer's vendored click's) ParameterSource
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            given.append(next(p.opts[0] for p in ctx.command.params if p.name == name))
    if given:
        options = " and ".join(given)
        fail(f"{options} appl{'ies' if len(given) == 1 else 'y'} only with {flag}, which was not given; "
             f"add {flag} or drop {options}")


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s" if rest >= 60 else f"{rest}s"


class LazyBar:
    """Progress on stderr, drawn at the first report, so that an error found while checking the inputs is
    not preceded by an empty bar. `update(done, total, stage="")` is the callback the library functions
    take; the first report's `done` (work found on disk) is not counted as speed.

    On a terminal, a rich bar per stage. Elsewhere (a log file, CI, a cluster job's output) rich draws
    nothing until the end, so a plain line per stage instead: at its first progress, then every
    TEA_PROGRESS_EVERY seconds (default 30; 0 = every report) while it runs, and when it completes:
    `LABEL STAGE: done/total (pct%), elapsed, ~left, rate/s`. Nothing before the first progress (unless
    a whole interval passes), so an error found at the start stays the one line on stderr."""

    def __init__(self, *columns: Any, console: Any, transient: bool = False, label: str = ""):
        self.columns, self.console, self.transient, self.label = columns, console, transient, label
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}
        self.lines: dict[str, dict[str, Any]] = {}
        text = os.environ.get("TEA_PROGRESS_EVERY", "30")
        try:
            self.every = float(text)
            if not self.every >= 0:
                raise ValueError
        except ValueError:
            fail(f"TEA_PROGRESS_EVERY={text!r}: give the seconds between progress lines, a number >= 0")

    def update(self, done: int, total: int, stage: str = "") -> None:
        if self.console.is_terminal:
            if self.bar is None:
                from rich.progress import Progress

                self.bar = Progress(*self.columns, console=self.console, transient=self.transient)
                self.bar.start()
            if stage not in self.tasks:
                self.tasks[stage] = self.bar.add_task(stage, total=total, completed=done)
            else:
                self.bar.update(self.tasks[stage], completed=done, total=total)
            return
        import time

        now = time.monotonic()
        line = self.lines.setdefault(stage, {"t0": now, "d0": done, "last": now, "printed": False, "finished": False})
        finished = total > 0 and done >= total
        first_progress = not line["printed"] and done > line["d0"]
        if line["finished"] or not (finished or first_progress or now - line["last"] >= self.every):
            return
        line.update(last=now, printed=True, finished=finished)
        elapsed, new = now - line["t0"], done - line["d0"]
        parts = [f"{done:,}/{total:,} ({100 * done / total if total else 0:.0f}%)", f"{duration(elapsed)} elapsed"]
        if new > 0 and elapsed > 0:
            rate = new / elapsed
            if not finished:
                parts.append(f"~{duration((total - done) / rate)} left")
            parts.append(f"{rate:.1f}/s")
        name = " ".join(x for x in (self.label, stage) if x)
        self.console.print(f"{name}: {', '.join(parts)}", markup=False, highlight=False)

    def __enter__(self) -> "LazyBar":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


def print_table(title: str, cells: dict[str, list[str]], *, right: tuple[str, ...] = (), no_wrap: tuple[str, ...] = (),
                shorten: tuple[str, ...] = (), drop: tuple[str, ...] = (), hidden: str = "") -> None:
    """A table of text cells (column → cells) on stdout. On a narrow terminal, rather than fold every cell over several
    lines: first the `shorten` columns' hub ids are cut to their last part, then the `drop` columns are hidden in
    order, and the caption names them (`hidden`: what follows their names)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    rows = len(next(iter(cells.values()), []))
    cells, gone = dict(cells), []
    for step in ("shorten", *drop):
        widths = [max(len(c), *(len(v) for v in vals)) for c, vals in cells.items()]
        if sum(widths) + 3 * len(widths) + 1 <= console.width:
            break
        if step == "shorten":
            for col in shorten:
                cells[col] = [v.rstrip("/").rsplit("/", 1)[-1] for v in cells[col]]
        else:
            del cells[step]
            gone.append(step)
    table = Table(title=title, caption=f"{', '.join(gone)} {hidden}" if gone else None)
    for col in cells:
        table.add_column(col, no_wrap=col in no_wrap, justify="right" if col in right else "left")
    for i in range(rows):
        table.add_row(*(vals[i] for vals in cells.values()))
    console.print(table)


def progress_bar(label: str, *, title: str | None = None, percent: bool = False, speed: str | None = None,
                 remaining: bool = True, transient: bool = False, console: Any = None) -> LazyBar:
    """A LazyBar on stderr (or `console`) with tea's columns: the title (default: the label; "{task.description}"
    names each stage), the bar, done/total (or a percentage), items per second (`speed`: their name), the time
    elapsed and left."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.text import Text

    class Speed(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(f"– {speed}/s" if not task.speed else f"{task.speed:.2f} {speed}/s")

    columns = [TextColumn(label if title is None else title), BarColumn(),
               TextColumn("{task.percentage:>5.1f}%") if percent else MofNCompleteColumn(),
               *([Speed()] if speed else []), TimeElapsedColumn(), *([TimeRemainingColumn()] if remaining else [])]
    return LazyBar(*columns, console=Console(stderr=True) if console is None else console, transient=transient, label=label)


def take_local_rank(args: list[str]) -> list[str]:
    """The command line without the `--local_rank=N` (or `--local_rank N`) that the deepspeed launcher adds to every
    rank's; N goes to LOCAL_RANK (unless set). A value that is not a GPU index is one `error:` line, exit 2."""
    args = list(args)
    for i, arg in enumerate(args):
        if arg == "--local_rank" or arg.startswith("--local_rank="):
            inline = "=" in arg
            value = arg.partition("=")[2] if inline else (args[i + 1] if i + 1 < len(args) else "")
            if not value.isdigit():
                try:  # outside a command: typer's Exit is not turned into the exit code here
                    fail(f"--local_rank expects a GPU index (the deepspeed launcher passes --local_rank=N), got {value!r}")
                except typer.Exit as exc:
                    raise SystemExit(exc.exit_code) from None
            os.environ.setdefault("LOCAL_RANK", value)
            del args[i : i + (1 if inline else 2)]
            break
    return args
