"""Prometheus: queries over prometheus-api-client (imported on first use), PromQL escaping
and the ``prom.wait`` action.

    backend = PrometheusApiBackend(PrometheusConfig(url="http://prometheus:9090"))
    backend.query(build('DCGM_FI_DEV_GPU_TEMP{hostname="$node"}', node=node))  # template.py
"""
