"""The test suite, a package so that its shared helpers import by name (`from tests.launching import ...`) from the
tests, the scripts they launch and the GPU check; pytest puts the repository root on `sys.path` (`pythonpath` in
pyproject.toml) and tests/conftest.py on `PYTHONPATH` for every process a test starts. Nothing here is a folder named
after a package (the vLLM tier is tests/vllm_tier/), so the root on the path shadows nothing."""
