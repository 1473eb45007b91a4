"""The API gate's logic (``make api``): what a user meets of an engine through the OpenAI API, judged
against the pinned vLLM's own server.

* :mod:`.settings` — the suite's ``[api]`` table;
* :mod:`.probes` — a :class:`~.probes.Probe` (one request as sent) and the :class:`~.probes.Context`
  every facet plans from;
* :mod:`.views` — a reply (JSON body or stream) -> the :class:`~.views.View` facets compare;
* :mod:`.observe` — send a facet's probes to an endpoint, keep every :class:`Exchange`;
* :mod:`.reference` — transformers' ``apply_chat_template`` renders and raw logprobs;
* :mod:`.facets` — one module per facet (template, streaming, stop, detokenization, structured
  output, tool calls, the logprob contract, robustness), each a registered :class:`~.facets.base.Facet`;
* :mod:`.proxy` — the planted controls: a proxy in front of the real server with one fault each.

The package never imports the pipeline; :mod:`harness.kinds.api` drives it.
"""
