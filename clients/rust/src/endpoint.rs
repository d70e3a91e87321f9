//! The node's URL, and the paths and query strings sent to it.

use hyper::Uri;

use crate::error::Error;

/// Where the node is: `host:port` (to connect to, and for the `Host` header) and a path
/// prefix (empty, or e.g. `/gossamer` for a node behind a proxy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub authority: String,
    pub prefix: String,
}

impl Endpoint {
    /// Reads `http://host[:port][/prefix]` (port 80 by default). No user info, query or
    /// fragment.
    pub fn parse(url: &str) -> Result<Endpoint, Error> {
        let bad = || Error::Url(url.to_owned());
        if url.contains('#') {
            return Err(bad());
        }
        let uri: Uri = url.parse().map_err(|_| bad())?;
        if uri.scheme_str() != Some("http") || uri.query().is_some() {
            return Err(bad());
        }
        let authority = uri.authority().ok_or_else(bad)?;
        if authority.host().is_empty() || authority.as_str().contains('@') {
            return Err(bad());
        }
        // host() keeps an IPv6 address's brackets, which is what connect and Host want.
        let host = authority.host();
        let port = match authority.as_str().strip_prefix(host) {
            Some("") => 80,
            Some(rest) => rest
                .strip_prefix(':')
                .and_then(|p| p.parse::<u16>().ok())
                .ok_or_else(bad)?,
            None => return Err(bad()),
        };
        Ok(Endpoint {
            authority: format!("{host}:{port}"),
            prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    /// The path of a check.
    pub fn check_path(&self) -> String {
        format!("{}/v1/check", self.prefix)
    }

    /// The path of a reserve.
    pub fn reserve_path(&self) -> String {
        format!("{}/v1/reserve", self.prefix)
    }

    /// The path of a settle.
    pub fn settle_path(&self) -> String {
        format!("{}/v1/settle", self.prefix)
    }

    /// The path and query of a status.
    pub fn status_path(&self, rule: &str, key: &str) -> String {
        let mut path = format!("{}/v1/status?rule=", self.prefix);
        percent_encode(&mut path, rule);
        path.push_str("&key=");
        percent_encode(&mut path, key);
        path
    }
}

/// Appends `s` to `out` with every byte but the unreserved ones (RFC 3986: letters, digits,
/// `-._~`) written as `%XX`, as a query value must be.
fn percent_encode(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: &str) -> (String, String) {
        let e = Endpoint::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        (e.authority, e.prefix)
    }

    #[test]
    fn reads_host_port_and_prefix() {
        let own = |a: &str, p: &str| (a.to_owned(), p.to_owned());
        assert_eq!(parsed("http://127.0.0.1:7070"), own("127.0.0.1:7070", ""));
        assert_eq!(parsed("http://127.0.0.1:7070/"), own("127.0.0.1:7070", ""));
        assert_eq!(parsed("http://localhost"), own("localhost:80", ""));
        assert_eq!(parsed("http://[::1]:7070"), own("[::1]:7070", ""));
        assert_eq!(
            parsed("http://proxy:8080/gossamer/"),
            own("proxy:8080", "/gossamer")
        );
    }

    #[test]
    fn refuses_what_is_not_a_plain_http_url() {
        for url in [
            "",
            "127.0.0.1:7070",
            "https://127.0.0.1:7070",
            "ftp://127.0.0.1:1",
            "http://",
            "http://a:7070/?x=1",
            "http://a:7070/#top",
            "http://user:pw@a:7070",
            "http://a:notaport",
            "http://a:70000",
            "http://a:",
        ] {
            match Endpoint::parse(url) {
                Err(Error::Url(u)) => assert_eq!(u, url),
                other => panic!("{url:?}: expected Error::Url, got {other:?}"),
            }
        }
    }

    #[test]
    fn paths_carry_the_prefix_and_an_encoded_query() {
        let e = Endpoint::parse("http://n:1/p").unwrap();
        assert_eq!(e.check_path(), "/p/v1/check");
        assert_eq!(e.reserve_path(), "/p/v1/reserve");
        assert_eq!(e.settle_path(), "/p/v1/settle");
        assert_eq!(
            e.status_path("api.v2", "a b&c=d/é~_-"),
            "/p/v1/status?rule=api.v2&key=a%20b%26c%3Dd%2F%C3%A9~_-"
        );
    }
}
