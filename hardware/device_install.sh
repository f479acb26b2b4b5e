# Sourced by a device-call script (hardware/device_call6.sh and later) on the TPU machine,
# from the repository root: pallas-check's wheel and the wheels the machine lacks
# (typer, rich, ...; carried in .whl-tpu, built by `pip wheel --no-deps . -w .whl-tpu`)
# installed into /tmp/site, which the calls then import before anything of the machine's.
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl-tpu/*.whl || exit 1
export PYTHONPATH=${PYTHONPATH:-}:/tmp/site:$PWD PYTHONUNBUFFERED=1
