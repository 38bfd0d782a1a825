"""The suite's list of tests that start processes which talk to each
other (tests/conftest.py marks them; tests/test_suite_marks.py keeps it
whole). A module of its own: the suite imports it by this name, where
`conftest` could be another folder's."""

# The tests that start processes which talk to each other (torch.distributed
# over gloo, torchrun, the pipeline's remote stages, the bench's process
# groups): their outcome depends on timing, ports and threads, so they carry
# the mark `processes` and run alone. `make pytest` runs the rest on
# TEST_JOBS workers first, then these one at a time; `make stress` repeats
# these (tools/stress.py).
PROCESS_TESTS = (
    "tests/test_distributed.py::",
    "tests/test_distributed_auto_layout.py::",
    "tests/test_distributed_mesh.py::",
    "tests/test_distributed_packed.py::",
    "tests/test_distributed_timeouts.py::",
    "tests/test_docs_examples.py::test_torchrun_block_runs_as_written",
    "tests/test_module_ddp.py::",
    "tests/test_pipeline_remote.py::",
    "tests/test_pipelining_peer.py::",
    "tests/test_bench_pipeline.py::",
)
