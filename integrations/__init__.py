"""Adapters to the outside world: model providers, tool sources, frameworks, engines.

One module each, each behind its own optional extra and imported lazily: importing
``guardstack.integrations.openai`` without the ``openai`` package installed works,
and using it raises an ``ImportError`` that names the extra to install
(``pip install 'guardstack[openai]'``).
"""
