"""The one accepted shape of `repoUrl`: https://github.com/<owner>/<repo>[.git][/].

Anything else is refused with a message saying why. Names are checked by GitHub's own rules,
which also rule out option injection (`-x`) and path tricks (`..`) before git ever sees them.
"""

import re
from dataclasses import dataclass

from recoup.errors import ApplicationError

# GitHub: 1-39 alphanumerics or single hyphens, not starting or ending with a hyphen.
_OWNER = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}")
# GitHub: up to 100 of letters, digits, '.', '_', '-'; we also refuse a leading '-' or '.'.
_REPO = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")
# The only host clients name; SANDBOX_GIT_BASE_URL may serve the same paths from elsewhere.
PUBLIC_BASE_URL = "https://github.com"
_PREFIX = f"{PUBLIC_BASE_URL}/"


class InvalidRepoUrl(ApplicationError):
    default_detail = "Invalid GitHub repository URL"


@dataclass(frozen=True)
class RepoRef:
    owner: str
    name: str

    @property
    def url(self) -> str:
        """The canonical public URL, as clients send it."""
        return f"{PUBLIC_BASE_URL}/{self.owner}/{self.name}"

    @property
    def clone_url(self) -> str:
        """The clone URL as GitHub gives it: the session's `cloneUrl` and a workspace's origin.

        Host-side git fetches it through SANDBOX_GIT_BASE_URL (sandboxes_app.git.commands).
        """
        return f"{self.url}.git"

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


def _reject(reason: str) -> InvalidRepoUrl:
    return InvalidRepoUrl(f"repoUrl: {reason}; expected https://github.com/<owner>/<repo>")


def parse_repo_url(value: object) -> RepoRef:
    """Validate a client's `repoUrl` and return its owner and repository name."""
    if not isinstance(value, str):
        raise _reject("must be a string")
    if value == "":
        raise _reject("must not be empty")
    if len(value) > 200:
        raise _reject("is too long")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise _reject("must not contain whitespace or control characters")
    if not value.startswith(_PREFIX):
        if "://" not in value and "::" not in value and not value.startswith("git@"):
            raise _reject("must be an absolute https URL")
        if value.lower().startswith(_PREFIX):
            raise _reject("scheme and host must be lowercase https://github.com")
        if not value.startswith("https://"):
            raise _reject("only https URLs are accepted")
        raise _reject("only github.com repositories are accepted")
    rest = value[len(_PREFIX) :]
    if "?" in rest or "#" in rest:
        raise _reject("must not contain a query string or fragment")
    if "@" in rest or "%" in rest or "\\" in rest:
        raise _reject("must not contain credentials or escaped characters")
    if rest.endswith("/"):
        rest = rest[:-1]
    parts = rest.split("/")
    if len(parts) != 2:
        raise _reject("must name exactly an owner and a repository")
    owner, name = parts
    if name.endswith(".git"):
        name = name[: -len(".git")]
    if not _OWNER.fullmatch(owner):
        raise _reject(f"{owner!r} is not a valid GitHub owner name")
    if name in ("", ".", "..") or not _REPO.fullmatch(name) or ".." in name:
        raise _reject(f"{name!r} is not a valid GitHub repository name")
    return RepoRef(owner=owner, name=name)
