"""Argument types that the commands share."""
import argparse
from pathlib import Path


def int_list(text):
    """'512,1024' -> [512, 1024]; '' -> []."""
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of whole numbers, got {text!r}") from None


def choice_list(accepted, ordered=False):
    """An argparse type: a comma list of one or more of accepted; with ordered, in accepted's order."""
    def parse(text):
        chosen = [x for x in text.replace(" ", "").split(",") if x]
        unknown = [x for x in chosen if x not in accepted]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(
                f"got {unknown or 'none'}; accepted: one or more of {', '.join(accepted)}")
        return [x for x in accepted if x in chosen] if ordered else chosen
    return parse


def add_out(parser, default):
    parser.add_argument("--out", type=Path, default=None, help=f"output folder (default {default})")


def add_device(parser):
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: cuda when a GPU and flashattn's kernels are there, else cpu")
