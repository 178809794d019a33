//! Who may call what: the origin's users and roles, its login with signed expiring tokens, and its rules
//! for which role a request needs (its `CoordinatorAuthInterceptor`).
//!
//! * Users come from `--users-file` or `SL_SERVE_USERS`: one `name:password:ROLE[,ROLE..]` per line
//!   (`#` starts a comment). Roles: `READ`, `WRITE`, `ADMIN`, `MONITOR`, `MEMBER`, granting as the
//!   origin's do (`ADMIN` everything, `WRITE` and `MONITOR` also `READ`).
//! * A request authenticates with `Authorization: Basic` or `Authorization: Bearer <token>` from
//!   `POST /coord/v1/auth/login`. A token is the origin's (`CoordinatorApiTokenCodec`):
//!   `base64url(payload).base64url(HMAC-SHA256(secret, base64url(payload)))`, no padding, with the
//!   payload `v1\n<username>\n<expiresAt epoch seconds>\n<roles sorted, comma-joined>`, so every
//!   replica sharing the secret (and an origin coordinator configured with it as
//!   `coordinator.api.token-secret`) accepts every replica's tokens and none stores them. Without
//!   `--token-secret` the secret is the origin's fallback, `<admin>:<password>:redis-stream-coordinator-token`,
//!   of the first `ADMIN` user (the origin's `admin-username`/`admin-password`).
//! * Required roles: producer routing and other reads `READ`, mutations `WRITE`, monitoring `READ`
//!   (health needs none: probes), heartbeats `MEMBER` only with `--authenticate-heartbeats` (the
//!   origin's `authenticateMemberApi`), login none.
//! * 401 has an empty body and `WWW-Authenticate`; 403 the error body.
//!
//! Credentials are compared in constant time (as HMACs under the secret) and never logged.

use std::collections::BTreeSet;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// A role of the origin's API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Role {
    /// Reads: producer routing, group state, monitoring.
    Read,
    /// Changes: group create/delete, scale, rollback.
    Write,
    /// Everything.
    Admin,
    /// Monitoring (reads).
    Monitor,
    /// Member heartbeats, when they are authenticated.
    Member,
}

impl Role {
    /// Whether holding `self` satisfies `required` (the origin's `ApiRole.grants`).
    pub fn grants(self, required: Role) -> bool {
        match self {
            Role::Admin => true,
            Role::Write => matches!(required, Role::Write | Role::Read),
            Role::Monitor => required == Role::Read,
            Role::Read => required == Role::Read,
            Role::Member => required == Role::Member,
        }
    }

    /// The origin's `ApiRole` name.
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "READ",
            Role::Write => "WRITE",
            Role::Admin => "ADMIN",
            Role::Monitor => "MONITOR",
            Role::Member => "MEMBER",
        }
    }

    /// The role of exactly this name (`ApiRole.valueOf`: case-sensitive).
    fn from_name(name: &str) -> Option<Self> {
        [
            Role::Read,
            Role::Write,
            Role::Admin,
            Role::Monitor,
            Role::Member,
        ]
        .into_iter()
        .find(|r| r.name() == name)
    }

    fn parse(name: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(name.trim().to_ascii_uppercase())).ok()
    }
}

/// Someone the server knows.
#[derive(Clone, PartialEq, Eq)]
pub struct User {
    /// The username.
    pub name: String,
    password: String,
    /// Its roles.
    pub roles: BTreeSet<Role>,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("roles", &self.roles)
            .finish_non_exhaustive()
    }
}

/// Parses `name:password:ROLE[,ROLE..]` lines; the error names the line (never its password).
pub fn parse_users(text: &str) -> Result<Vec<User>, String> {
    let mut users = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.splitn(3, ':');
        let (Some(name), Some(password), Some(roles)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "users line {}: expected name:password:ROLE[,ROLE..]",
                n + 1
            ));
        };
        let roles = roles
            .split(',')
            .map(|r| {
                Role::parse(r).ok_or_else(|| format!("users line {}: unknown role {r:?}", n + 1))
            })
            .collect::<Result<BTreeSet<_>, _>>()?;
        if name.is_empty() || password.is_empty() {
            return Err(format!("users line {}: empty name or password", n + 1));
        }
        users.push(User {
            name: name.to_string(),
            password: password.to_string(),
            roles,
        });
    }
    Ok(users)
}

/// The origin's token secret when none is configured (`CoordinatorApiTokenCodec.tokenSecret`):
/// `<adminUsername>:<adminPassword>:redis-stream-coordinator-token`, with the first `ADMIN` user as the
/// origin's admin.
pub fn fallback_secret(users: &[User]) -> Option<String> {
    let admin = users.iter().find(|u| u.roles.contains(&Role::Admin))?;
    Some(format!(
        "{}:{}:redis-stream-coordinator-token",
        admin.name, admin.password
    ))
}

/// The claims a token carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The username.
    pub sub: String,
    /// Its roles when the token was issued.
    pub roles: BTreeSet<Role>,
    /// Expiry, Unix seconds.
    pub exp: u64,
}

/// The server's users, token secret and settings; `None` in the state when no user is configured
/// (then nothing is authenticated, as a server without users has nobody to check).
pub struct Auth {
    users: Vec<User>,
    secret: Vec<u8>,
    /// How long a login's token is valid.
    pub token_ttl: Duration,
    /// Whether heartbeats need the `MEMBER` role.
    pub authenticate_heartbeats: bool,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("users", &self.users)
            .field("token_ttl", &self.token_ttl)
            .field("authenticate_heartbeats", &self.authenticate_heartbeats)
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// Users, the token secret (at least 16 bytes: tokens are only as strong as it), token lifetime.
    pub fn new(
        users: Vec<User>,
        secret: &str,
        token_ttl: Duration,
        authenticate_heartbeats: bool,
    ) -> Result<Self, String> {
        if secret.len() < 16 {
            return Err(
                "--token-secret must be at least 16 bytes when users are configured".into(),
            );
        }
        Ok(Self {
            users,
            secret: secret.as_bytes().to_vec(),
            token_ttl,
            authenticate_heartbeats,
        })
    }

    fn mac(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.secret).expect("HMAC takes any key length");
        for part in parts {
            mac.update(part);
        }
        mac
    }

    /// The user with this name and password (compared in constant time).
    pub fn check_password(&self, name: &str, password: &str) -> Option<&User> {
        let user = self.users.iter().find(|u| u.name == name)?;
        let expected = self
            .mac(&[b"password\0", user.password.as_bytes()])
            .finalize()
            .into_bytes();
        self.mac(&[b"password\0", password.as_bytes()])
            .verify_slice(&expected)
            .ok()
            .map(|()| user)
    }

    /// The user with this name (after a Basic check).
    pub fn check_user(&self, name: &str) -> Option<&User> {
        self.users.iter().find(|u| u.name == name)
    }

    /// A signed token for `user`, valid until `now_secs + token_ttl`, in the origin's format
    /// (`CoordinatorApiTokenCodec`): base64url (no padding) of the payload
    /// `v1\n<username>\n<expiresAt epoch seconds>\n<roles sorted, comma-joined>`, a dot, and base64url
    /// (no padding) of the HMAC-SHA256 of that base64url text under the secret. A token the origin
    /// issues with the same secret verifies here, and one issued here verifies there.
    pub fn issue(&self, user: &User, now_secs: u64) -> (String, Claims) {
        let claims = Claims {
            sub: user.name.clone(),
            roles: user.roles.clone(),
            exp: now_secs.saturating_add(self.token_ttl.as_secs()),
        };
        let mut names: Vec<&'static str> = claims.roles.iter().map(|r| r.name()).collect();
        names.sort_unstable();
        let payload = format!("v1\n{}\n{}\n{}", claims.sub, claims.exp, names.join(","));
        let payload = URL_SAFE_NO_PAD.encode(payload.as_bytes());
        let signature = self.mac(&[payload.as_bytes()]).finalize().into_bytes();
        let token = format!("{payload}.{}", URL_SAFE_NO_PAD.encode(signature));
        (token, claims)
    }

    /// The claims of a token signed with our secret and not expired at `now_secs` (the origin's
    /// `decode`: four payload lines, version `v1`, unknown roles dropped, at least one role).
    pub fn verify(&self, token: &str, now_secs: u64) -> Option<Claims> {
        let (payload, signature) = token.split_once('.')?;
        if payload.trim().is_empty() || signature.trim().is_empty() {
            return None;
        }
        // The origin's decoder accepts padded base64url too.
        let signature = URL_SAFE_NO_PAD
            .decode(signature.trim_end_matches('='))
            .ok()?;
        self.mac(&[payload.as_bytes()])
            .verify_slice(&signature)
            .ok()?;
        let text =
            String::from_utf8(URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?).ok()?;
        let fields: Vec<&str> = text.split('\n').collect();
        let [version, sub, exp, roles] = fields[..] else {
            return None;
        };
        if version != "v1" {
            return None;
        }
        let exp: u64 = exp.parse().ok()?;
        let roles: BTreeSet<Role> = roles
            .split(',')
            .filter(|r| !r.trim().is_empty())
            .filter_map(Role::from_name)
            .collect();
        if roles.is_empty() || exp <= now_secs {
            return None;
        }
        Some(Claims {
            sub: sub.to_string(),
            roles,
            exp,
        })
    }

    /// The roles of an `Authorization` header's caller: Basic (a known user) or Bearer (a valid token).
    pub fn authenticate(&self, authorization: Option<&str>, now_secs: u64) -> Option<Claims> {
        let header = authorization?.trim();
        let (scheme, value) = header.split_once(' ')?;
        match scheme.to_ascii_lowercase().as_str() {
            "bearer" => self.verify(value.trim(), now_secs),
            "basic" => {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(value.trim())
                    .ok()?;
                let decoded = String::from_utf8(decoded).ok()?;
                let (name, password) = decoded.split_once(':')?;
                let user = self.check_password(name, password)?;
                Some(Claims {
                    sub: user.name.clone(),
                    roles: user.roles.clone(),
                    exp: now_secs.saturating_add(1),
                })
            }
            _ => None,
        }
    }
}

/// The role a request needs (the origin's rules), `None` for none.
pub fn required_role(path: &str, method: &str, authenticate_heartbeats: bool) -> Option<Role> {
    let mutation = matches!(method, "POST" | "PUT" | "PATCH" | "DELETE");
    if path == "/coord/v1/auth/login" || path == "/coord/v1/monitoring/health" {
        return None;
    }
    if path.contains("/members/") && path.ends_with("/heartbeat") {
        return authenticate_heartbeats.then_some(Role::Member);
    }
    if path.starts_with("/coord/v1/monitoring") {
        return Some(Role::Read);
    }
    Some(if mutation { Role::Write } else { Role::Read })
}

/// RFC 3339 (UTC, seconds) of Unix seconds, for `expiresAt`.
pub fn rfc3339(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> Auth {
        let users = parse_users(
            "# users\nalice:s3cret:READ\nbob:pw:WRITE,MEMBER\nroot:toor:admin\nmon:m:MONITOR\n",
        )
        .unwrap();
        Auth::new(
            users,
            "0123456789abcdef-secret",
            Duration::from_secs(60),
            false,
        )
        .unwrap()
    }

    #[test]
    fn roles_grant_as_the_origins_do() {
        assert!(Role::Admin.grants(Role::Member));
        assert!(Role::Write.grants(Role::Read));
        assert!(!Role::Write.grants(Role::Member));
        assert!(Role::Monitor.grants(Role::Read));
        assert!(!Role::Read.grants(Role::Write));
        assert!(!Role::Member.grants(Role::Read));
    }

    #[test]
    fn users_parse_and_bad_lines_are_named_without_their_password() {
        let users = parse_users("a:p:READ,member").unwrap();
        assert_eq!(users[0].roles, [Role::Read, Role::Member].into());
        let error = parse_users("ok:x:READ\nbad:hunter2:ROOT").unwrap_err();
        assert!(error.contains("line 2"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
        assert!(parse_users("nopassword").is_err());
        let secret = parse_users("carol:hunter2:READ").unwrap();
        assert!(!format!("{secret:?}").contains("hunter2"));
    }

    #[test]
    fn tokens_verify_until_they_expire_and_not_once_tampered() {
        let auth = auth();
        let bob = auth.check_password("bob", "pw").unwrap().clone();
        let (token, claims) = auth.issue(&bob, 1_000);
        assert_eq!(claims.exp, 1_060);
        assert_eq!(auth.verify(&token, 1_059).unwrap().roles, bob.roles);
        assert_eq!(auth.verify(&token, 1_060), None, "expired");
        let mut forged = token.clone();
        forged.insert(5, 'x');
        assert!(!token.starts_with("v1."), "the origin's format: {token}");
        assert_eq!(auth.verify(&forged, 1_000), None);
        let other =
            Auth::new(vec![], "another-secret-16b", Duration::from_secs(60), false).unwrap();
        assert_eq!(other.verify(&token, 1_000), None, "another secret");
        assert!(auth.check_password("bob", "wrong").is_none());
        assert!(auth.check_password("nobody", "pw").is_none());
    }

    /// A token computed by hand per the origin's `CoordinatorApiTokenCodec` (payload
    /// `v1\nadmin\n2000000000\nADMIN,MONITOR`, base64url without padding, HMAC-SHA256 of that text
    /// under the origin's fallback secret for admin `admin` / `changeit`): we issue exactly it and accept it.
    #[test]
    fn tokens_are_the_origins_known_vector() {
        const ORIGIN: &str = "djEKYWRtaW4KMjAwMDAwMDAwMApBRE1JTixNT05JVE9S.\
                              bq5EaACr4k3aG2pR97Yu6SWWM7DBNEM9CjTYtr0RwqM";
        let users = parse_users("admin:changeit:MONITOR,ADMIN").unwrap();
        let secret = fallback_secret(&users).unwrap();
        assert_eq!(secret, "admin:changeit:redis-stream-coordinator-token");
        let auth = Auth::new(users.clone(), &secret, Duration::from_secs(1_000), false).unwrap();
        let (token, claims) = auth.issue(&users[0], 1_999_999_000);
        assert_eq!(token, ORIGIN);
        assert_eq!(claims.exp, 2_000_000_000);
        let verified = auth.verify(ORIGIN, 1_999_999_999).unwrap();
        assert_eq!(verified.sub, "admin");
        assert_eq!(verified.roles, [Role::Admin, Role::Monitor].into());
        assert_eq!(auth.verify(ORIGIN, 2_000_000_000), None, "expired");
        // Roles are case-sensitive names, as `ApiRole.valueOf`; none known: refused.
        let sign = |payload: &str| {
            let payload = URL_SAFE_NO_PAD.encode(payload);
            let sig = auth.mac(&[payload.as_bytes()]).finalize().into_bytes();
            format!("{payload}.{}", URL_SAFE_NO_PAD.encode(sig))
        };
        assert_eq!(auth.verify(&sign("v1\nadmin\n2000000000\nadmin"), 5), None);
        assert_eq!(auth.verify(&sign("v2\nadmin\n2000000000\nREAD"), 5), None);
        assert_eq!(auth.verify(&sign("v1\nadmin\n2000000000"), 5), None);
        assert_eq!(
            auth.verify(&sign("v1\nx\n2000000000\nREAD,BOGUS"), 5)
                .unwrap()
                .roles,
            [Role::Read].into()
        );
        assert!(fallback_secret(&parse_users("r:p:READ").unwrap()).is_none());
    }

    #[test]
    fn basic_and_bearer_headers_authenticate() {
        let auth = auth();
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("alice:s3cret")
        );
        assert_eq!(auth.authenticate(Some(&basic), 5).unwrap().sub, "alice");
        let wrong = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("alice:nope")
        );
        assert_eq!(auth.authenticate(Some(&wrong), 5), None);
        let root = auth.check_password("root", "toor").unwrap().clone();
        let (token, _) = auth.issue(&root, 5);
        assert_eq!(
            auth.authenticate(Some(&format!("Bearer {token}")), 6)
                .unwrap()
                .sub,
            "root"
        );
        assert_eq!(auth.authenticate(None, 5), None);
        assert_eq!(auth.authenticate(Some("Digest abc"), 5), None);
    }

    #[test]
    fn required_roles_follow_the_origins_rules() {
        let hb = "/coord/v1/streams/s/groups/g/members/m/heartbeat";
        assert_eq!(required_role(hb, "POST", false), None);
        assert_eq!(required_role(hb, "POST", true), Some(Role::Member));
        assert_eq!(
            required_role(
                "/coord/v1/streams/s/groups/g/producer-routing",
                "GET",
                false
            ),
            Some(Role::Read)
        );
        assert_eq!(
            required_role("/coord/v1/streams/s/scale", "POST", false),
            Some(Role::Write)
        );
        assert_eq!(
            required_role("/coord/v1/monitoring/groups", "GET", false),
            Some(Role::Read)
        );
        assert_eq!(
            required_role("/coord/v1/monitoring/health", "GET", true),
            None
        );
        assert_eq!(required_role("/coord/v1/auth/login", "POST", true), None);
        // The admin endpoints: changes WRITE (ADMIN grants it), reads READ; /metrics READ.
        let group = "/coord/v1/streams/s/groups/g";
        assert_eq!(required_role(group, "DELETE", false), Some(Role::Write));
        assert_eq!(required_role(group, "POST", false), Some(Role::Write));
        assert_eq!(required_role(group, "GET", false), Some(Role::Read));
        assert_eq!(
            required_role(&format!("{group}/migrations/7/rollback"), "POST", false),
            Some(Role::Write)
        );
        assert_eq!(required_role("/metrics", "GET", false), Some(Role::Read));
        assert!(Role::Admin.grants(Role::Write) && !Role::Read.grants(Role::Write));
    }

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_798_761_599), "2026-12-31T23:59:59Z");
    }
}
