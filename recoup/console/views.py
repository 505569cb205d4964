"""The console's pages: thin views over the sign-in, the session services and their reads.

Every action past creating a session (provisioning, commands, hibernation) is a call the page's
script makes to the REST API, authenticated by `ConsoleSessionAuthentication`.
"""

import uuid
from collections.abc import Callable
from functools import wraps

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from recoup.console import selectors
from recoup.console.auth import console_account, console_sign_in, console_sign_out
from recoup.console.forms import NewSessionForm, SignInForm
from recoup.errors import ApplicationError
from sessions_app.services import session_create

BAD_KEY = "That API key is not valid: it is unknown, revoked or expired."
# Only our own script, styles and API: text a page shows (a title, a command's output) can never
# run as script, even if some day it reached the page unescaped.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def console_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        response = view(request, *args, **kwargs)
        response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response["Referrer-Policy"] = "same-origin"
        return response

    return never_cache(wrapped)


def _sign_in_page(request: HttpRequest, form: SignInForm, *, status: int = 200) -> HttpResponse:
    return render(request, "console/signin.html", {"form": form}, status=status)


def _sessions_page(
    request: HttpRequest, form: NewSessionForm, *, status: int = 200
) -> HttpResponse:
    sessions = selectors.console_sessions(account=form.account)
    context = {"account": form.account, "form": form, "sessions": sessions}
    return render(request, "console/sessions.html", context, status=status)


@console_page
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    account = console_account(request)
    if account is None:
        return _sign_in_page(request, SignInForm())
    return _sessions_page(request, NewSessionForm(account=account))


@console_page
@require_POST
def sign_in(request: HttpRequest) -> HttpResponse:
    form = SignInForm(request.POST)
    if form.is_valid() and console_sign_in(request, raw_key=form.cleaned_data["api_key"]):
        return redirect("console:home", permanent=False)
    form.add_error(None, BAD_KEY)
    return _sign_in_page(request, form, status=400)


@console_page
@require_POST
def sign_out(request: HttpRequest) -> HttpResponse:
    console_sign_out(request)
    return redirect("console:home")


@console_page
@require_POST
def new_session(request: HttpRequest) -> HttpResponse:
    account = console_account(request)
    if account is None:
        return redirect("console:home")
    form = NewSessionForm(request.POST, account=account)
    if not form.is_valid():
        return _sessions_page(request, form, status=400)
    org = form.cleaned_data["organization"]
    try:
        session = session_create(
            account=account,
            title=form.cleaned_data["title"],
            organization_id=uuid.UUID(org) if org else None,
            repo=form.cleaned_data["repo_url"],
        )
    except ApplicationError as exc:  # say, the membership ended since the form was shown
        form.add_error(None, str(exc.detail))
        return _sessions_page(request, form, status=400)
    return redirect("console:session", session_id=session.id)


@console_page
@require_GET
def session_page(request: HttpRequest, session_id: str) -> HttpResponse:
    account = console_account(request)
    if account is None:
        return redirect("console:home")
    session = selectors.console_session(account=account, session_id=session_id)
    if session is None:
        raise Http404("No such session")
    context = {
        "account": account,
        "session": session,
        "repo_url": (
            f"https://github.com/{session.repo_owner}/{session.repo_name}"
            if session.repo_owner and session.repo_name
            else ""
        ),
        "history": selectors.console_session_history(session=session),
        # How the API records this account's own actions (sandboxes_app.views.actor_of).
        "own_actor": f"api:{account.pk}",
    }
    return render(request, "console/session.html", context)
