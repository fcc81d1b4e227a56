"""The one runner of flashattn's benchmarks: `python -m benchmarks COMMAND [options]`, from the
repository root (`python -m benchmarks COMMAND --help` lists a command's options)."""
import argparse
import shlex
import sys

from benchmarks import decode, decode_fp8, decode_layouts, decode_overhead, families, features, fp8, paged, parallel, sweep
from benchmarks.suite import cli as suite
from benchmarks.suite import redraw

COMMANDS = {
    "suite": suite,
    "sweep": sweep,
    "features": features,
    "families": families,
    "fp8": fp8,
    "decode": decode,
    "decode-fp8": decode_fp8,
    "decode-layouts": decode_layouts,
    "decode-overhead": decode_overhead,
    "paged": paged,
    "parallel": parallel,
    "plots": redraw,
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        command = commands.add_parser(name, help=module.HELP, description=module.__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    args = parser.parse_args(argv)
    args.command_line = shlex.join(["python", "-m", "benchmarks", *argv])
    return args.run(args)


sys.exit(main())
