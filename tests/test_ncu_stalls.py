"""scripts/ncu_stalls.py on a hand-made SASS source page (no GPU, no Nsight Compute): the samples no
stall column claims go to the HGMMA line, and the shared-memory wavefronts are summed by class."""

import csv
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ncu_stalls.py"
HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "L1 Wavefronts Shared",
          "stall_mio", "stall_wait", "stall_mio (Not Issued)"]


def load_script():
    spec = importlib.util.spec_from_file_location("ncu_stalls", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sums_reasons_and_wavefronts(tmp_path, capsys):
    page = tmp_path / "source.csv"
    with open(page, "w", newline="") as f:
        w = csv.writer(f)
        for kernel, scale in (("first_kernel", 1), ("second_kernel", 3)):
            w.writerow(["Kernel Name", kernel])
            w.writerow(HEADER)
            w.writerow(["0x10", "HGMMA.64x80x16.F32.BF16 R0, gdesc[UR8], RZ", 100 * scale, 10, 90, 5, 0, 5])
            w.writerow(["0x20", "STS [R7], R152", 40 * scale, 20, 20, 30 * scale, 10 * scale, 30])
            w.writerow(["0x30", "@!P0 LDS.64 R2, [R0]", 60 * scale, 10, 20, 0, 60 * scale, 0])
    load_script().main(str(page), 2)
    out = capsys.readouterr().out
    first, second = out.split("second_kernel")
    assert "samples 200" in first and "samples 600" in second

    def line(text: str, label: str) -> list[str]:
        return next(ln.split() for ln in text.splitlines() if ln.strip().startswith(label))

    # 100 HGMMA samples, 5 of them claimed by mio: 95 unclaimed; mio 5 + 30 = 35 of 200
    assert line(first, "(unclaimed: HGMMA)")[-2:] == ["95", "47.5%"]
    assert line(first, "mio")[1:] == ["35", "17.5%"]
    assert line(second, "mio")[1:] == ["95", "15.8%"]
    # wavefronts: HGMMA.64x80x16 90 of 130, STS 20, LDS 20 (the predicate does not hide the opcode)
    assert line(first, "HGMMA.64x80x16")[1:3] == ["90", "(69.2%),"]
    assert line(first, "LDS")[-4:] == ["2.0", "per", "warp", "instruction"]
    assert len([ln for ln in first.splitlines() if ln.strip().startswith("0x")]) == 2  # the top two
