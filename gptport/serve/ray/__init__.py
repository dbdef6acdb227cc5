"""gptport serve on Ray Serve: the deployment, the local cluster `gptport serve --ray` starts, the proxy's errors."""
