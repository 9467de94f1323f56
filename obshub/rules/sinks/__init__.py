"""Alert sinks: Slack (Block Kit), PagerDuty Events API v2, Alertmanager v2, generic JSON webhook, console.

Each sink turns a :class:`rules.sinks.base.Notification` into HTTP requests and classifies responses
(``base.classify``); ``base.deliver`` is the one shared retry stage (tenacity: exponential backoff with
jitter, Retry-After on 429, no retry on other 4xx). ``rules.sinks.config`` builds sinks from the
alerting config, reading secrets from the environment or files."""
