"""`pallas_check.checking()` in a real Jupyter kernel (issue 36, item 11): the block writes
nothing of ours into the cell, and its Run shows as ONE rich output, rich's HTML of the
report with the plain table as its text/plain fallback.

rich's Console takes over output inside an IPython kernel (each `print` becomes its own
`display_data`), which a fake IPython cannot show: only a kernel run by nbclient, as
`jupyter nbconvert --execute` runs one, does. One kernel: its start and JAX's import are
the cost (a few seconds).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from pallas_check.findings.finding import FindingKind

ROOT = Path(__file__).resolve().parents[2]

# A kernel that reads its DMA's destination before the wait (as
# samples/dma_read_before_wait_bug.py): under --dma on_wait the first step's read of buf
# sees never-written memory, which reaches the output's first block. It prints once per grid step: the kernel's own output, which the
# cell must show (and nothing else of ours).
KERNEL = textwrap.dedent('''\
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu


    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()
        pl.debug_print("step {}", pl.program_id(0))
        y = buf[...] + 1.0
        copy.wait()
        o_ref[...] = y


    def plus_one(x):
        return pl.pallas_call(
            kernel, grid=(2,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        )(x)
''')
READ_LINE = 11  # `y = buf[...] + 1.0`

CELLS = [
    # No JAX backend starts here: the checking() block is the first to use one, so its
    # start-up (libtpu's chatter, kept quiet by pallas-check) happens inside the block.
    f"import sys\nsys.path[:0] = [{str(ROOT)!r}]\n"
    "import jax, jax.numpy as jnp, pallas_check, kern",
    "with pallas_check.checking(dma='on_wait', races=False, project=False) as run:\n"
    "    out = jax.block_until_ready(jax.jit(kern.plus_one)(jnp.ones((8, 128), jnp.float32)))",
    "run",
]


def _executed(folder: Path) -> list:
    """The notebook's cells after nbclient ran them in a fresh ipykernel."""
    (folder / "kern.py").write_text(KERNEL)
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(source) for source in CELLS])
    # The kernel is this Python (jupyter_client runs the native "python3" kernel with
    # sys.executable) with this process's environment (JAX_PLATFORMS=cpu: conftest.py).
    client = NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}})
    with pytest.MonkeyPatch.context() as patch:  # the kernel's files not in $HOME
        patch.setenv("IPYTHONDIR", str(folder / "ipython"))
        patch.setenv("JUPYTER_RUNTIME_DIR", str(folder / "runtime"))
        client.execute()
    return notebook.cells


def test_a_notebook_shows_the_kernels_prints_then_the_run_as_one_html_output(tmp_path):
    """One test (one kernel, started once whatever pytest-xdist does): the block's cell,
    then the cell that shows the Run."""
    executed = _executed(tmp_path)
    assert executed[0].outputs == []  # the imports: not a word
    # The block: nothing of ours, only what the kernel printed.
    outputs = executed[1].outputs
    # (one stream output per flush of the kernel's prints: how many is the kernel's)
    assert {(o.output_type, o.name) for o in outputs} == {("stream", "stdout")}, outputs
    assert "".join(o.text for o in outputs) == (
        "[dev 0 core 0 (0,)] step 0\n[dev 0 core 0 (1,)] step 1\n")

    # The Run: one result, the HTML table with the plain table as its fallback.
    outputs = executed[2].outputs
    # One result: no display_data per line of the report, no stream.
    assert [o.output_type for o in outputs] == ["execute_result"], outputs
    [output] = outputs
    assert sorted(output.data) == ["text/html", "text/plain"]
    page = output.data["text/html"]
    assert page.startswith("<pre style=") and page.rstrip().endswith("</pre>")
    title = FindingKind.UNINITIALIZED.info.title
    assert f"{title} (1)" in page  # the kind's table
    assert "buf[0:8, 0:128]" in page and f"kern.py:{READ_LINE}" in page
    assert "1 finding in 1 pallas_call" in page
    assert '<span style="' in page and "\x1b" not in page  # styled as on a terminal
    plain = output.data["text/plain"]  # what a front end without HTML shows: the table
    assert f"{title} (1)" in plain and "buf[0:8, 0:128]" in plain
    assert plain.rstrip().endswith("pallas-check: 1 finding in 1 pallas_call; races not checked")
    assert "\x1b" not in plain
