"""Errors the services raise for bad input; the API and CLI show them as they are.

A refusal's text is a whole English sentence made with ``N_`` (b2bhub.domain.i18n), its
names and numbers as ``%(name)s`` parameters: ``.message`` is that English text (the
API's and the CLI's, a str), and it keeps its msgid and parameters, so a page shows it
in the reader's language (b2bhub.web.forms.said). The same holds for ``details``'
texts. A text not made with ``N_`` (a partner's answer) is shown as it is.
"""

from __future__ import annotations


class ServiceError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, message: str, details: dict | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.details = message, details or {}
        if code:
            self.code = code


class NotFound(ServiceError):
    status, code = 404, "not_found"


class Conflict(ServiceError):
    status, code = 409, "conflict"
