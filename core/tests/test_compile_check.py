"""The SASS loop finder of ``jagflash.core.compile_check --loops`` on hand-written nvdisasm
output (no compiler needed): innermost loops only, their instructions counted once each."""

from __future__ import annotations

from jagflash.core.compile_check import sass_loops

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
.L_x_1:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0030*/                   LDL.64 R4, [R1+0x8] ;
        /*0040*/                   FFMA R5, R6, R7, R8 ;
        /*0050*/               @P0 BRA `(.L_x_1) ;
        /*0060*/                   STL [R1+0x4], R2 ;
        /*0070*/              @!P1 BRA `(.L_x_0) ;
.L_x_2:
        /*0080*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R3], R4 ;
        /*0090*/               @!P0 BRA `(.L_x_2) ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   BRA `(.L_x_3) ;
.L_x_3:
        /*00c0*/                   EXIT ;
"""


def test_innermost_loops_and_their_opcodes() -> None:
    loops = sass_loops(SASS)
    assert [(lp.start, lp.end) for lp in loops] == [(0x20, 0x50), (0x80, 0x90)]
    body = loops[0]
    assert body.instructions == 4
    assert (body.opcodes["HGMMA"], body.opcodes["LDL"], body.opcodes["STL"], body.opcodes["BRA"]) == (1, 1, 0, 1)
    assert "1 HGMMA, 1 LDL, 0 STL" in body.describe()
    assert loops[1].opcodes["SYNCS"] == 1  # a predicated branch back to the wait is a loop too


def test_no_loops_in_straight_code() -> None:
    assert sass_loops("        /*0000*/   EXIT ;\n") == []


def test_launch_attrs_mark_pointers_and_16_divisible_ints() -> None:
    """As Triton's launcher does: pointers 16-byte aligned, ints marked ``:16`` divisible by 16
    (the mark is stripped from the signature); other ints and constexprs unmarked."""
    from jagflash.core.compile_check import launch_attrs

    def kernel(X, n, stride, BLOCK):
        pass

    sig, attrs = launch_attrs(kernel, {"X": "*fp32", "n": "i32", "stride": "i32:16", "BLOCK": "constexpr"})
    assert sig == {"X": "*fp32", "n": "i32", "stride": "i32", "BLOCK": "constexpr"}
    assert attrs == {(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}
