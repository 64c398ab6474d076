"""``cde-st-serve``: an OpenAI-compatible embedding server with named corpus contexts.

The modules split one concept each: :mod:`~cde_st.serving.errors` (OpenAI's error object),
:mod:`~cde_st.serving.requests` (validating request bodies), :mod:`~cde_st.fingerprints` (which model a context
belongs to), :mod:`~cde_st.serving.contexts` (the named contexts and their files), :mod:`~cde_st.serving.engine`
(the model, run in one worker thread), :mod:`~cde_st.serving.forwards` (its forwards: all a model process builds), :mod:`~cde_st.serving.batching` (coalescing concurrent requests),
:mod:`~cde_st.serving.metrics` (Prometheus), :mod:`~cde_st.serving.readiness` (warm-up and ``/ready``),
:mod:`~cde_st.serving.connections` (bounds on connections), :mod:`~cde_st.serving.app` (the HTTP routes),
:mod:`~cde_st.serving.serve_command` (the command) and :mod:`~cde_st.serving.defaults` (the command's defaults,
which the classes share). Only ``app``, ``metrics`` and ``serve_command`` need the ``serve`` extra (FastAPI,
uvicorn, prometheus-client); nothing here is imported by ``cde_st`` itself.
"""
