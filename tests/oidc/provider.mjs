// A real OpenID provider for the SSO tests: node's certified `oidc-provider` (https://github.com/panva/node-oidc-provider),
// with a plain login form instead of its dev interactions, accounts read from a JSON file at every look-up (so a test
// changes a user's groups or disables them between logins), and RP-initiated logout on.
//
// Usage: node provider.mjs CONFIG.json   (CONFIG: {"port", "client": {...oidc-provider client metadata}, "accounts"})
// "accounts" names a file: {"<sub>": {"password", "email", "name", "groups": [...], "disabled": bool}}.
// It prints "ready <issuer>" on stdout once it listens on 127.0.0.1:<port>.
import { readFileSync } from "node:fs";
import http from "node:http";
import { createRequire } from "node:module";

const require = createRequire(process.env.OIDC_PROVIDER_MODULES + "/");
const { default: Provider } = await import(require.resolve("oidc-provider"));

const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const issuer = `http://127.0.0.1:${config.port}`;
const accounts = () => JSON.parse(readFileSync(config.accounts, "utf8"));

const provider = new Provider(issuer, {
  clients: [config.client],
  cookies: { keys: ["rigdash-test-provider-cookie-key"] },
  claims: {
    openid: ["sub"],
    email: ["email", "email_verified"],
    profile: ["name", "preferred_username"],
    groups: ["groups"],
  },
  // A disabled account is no account: no token, no userinfo.
  async findAccount(ctx, sub) {
    const account = accounts()[sub];
    if (!account || account.disabled) return undefined;
    return {
      accountId: sub,
      async claims() {
        return {
          sub,
          email: account.email,
          email_verified: true,
          name: account.name,
          preferred_username: account.username ?? sub,
          groups: account.groups ?? [],
        };
      },
    };
  },
  features: { devInteractions: { enabled: false }, rpInitiatedLogout: { enabled: true } },
  pkce: { required: () => true },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
});
provider.proxy = false;

const escape = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

async function body(req) {
  let data = "";
  for await (const chunk of req) data += chunk;
  return new URLSearchParams(data);
}

// The login form: one POST with username and password; a disabled account is refused with access_denied, the
// answer Keycloak and Authentik give the client when an administrator has disabled the user.
async function interaction(req, res, uid) {
  const details = await provider.interactionDetails(req, res);
  if (req.method === "GET") {
    res.setHeader("content-type", "text/html; charset=utf-8");
    res.end(`<!doctype html><title>Sign in</title><form method="post" action="/interaction/${escape(uid)}">
      <input name="username"><input name="password" type="password"><button>Sign in</button></form>`);
    return;
  }
  const form = await body(req);
  const sub = form.get("username");
  const account = accounts()[sub];
  if (!account || account.password !== form.get("password")) {
    res.statusCode = 401;
    res.end("wrong username or password");
    return;
  }
  if (account.disabled) {
    await provider.interactionFinished(req, res, { error: "access_denied", error_description: "account disabled" });
    return;
  }
  const grant = new provider.Grant({ accountId: sub, clientId: details.params.client_id });
  grant.addOIDCScope(details.params.scope);
  const grantId = await grant.save();
  await provider.interactionFinished(req, res, { login: { accountId: sub }, consent: { grantId } }, {
    mergeWithLastSubmission: false,
  });
}

const callback = provider.callback();
http
  .createServer((req, res) => {
    const match = /^\/interaction\/([\w-]+)$/.exec(new URL(req.url, issuer).pathname);
    if (!match) return callback(req, res);
    interaction(req, res, match[1]).catch((error) => {
      res.statusCode = 500;
      res.end(String(error));
    });
  })
  .listen(config.port, "127.0.0.1", () => console.log(`ready ${issuer}`));
