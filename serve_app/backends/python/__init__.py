"""Triton's Python backend: ``model.py`` with ``class TritonPythonModel``, run as Triton's stub runs it.

Each instance runs in a process of its own (a dedicated replica), so a model's
crash or its imports never reach another model.  The module its code imports
as ``triton_python_backend_utils`` is :mod:`serve_app.backends.python.utils`,
with Triton's names, signatures and error messages.  ``execute`` receives the
batch's requests as a list (nothing is merged); decoupled models answer
through each request's response sender, streamed to the client as they send.
"""
