import { randomUUID } from 'node:crypto';

/**
 * Handoff tokens minted by Prefill, kept in this n8n process and never in an item.
 *
 * A prefill answers a single-use token. Writing it into an item's JSON would show it in the
 * editor, store it in the execution log and hand it to every later node. The item carries a
 * reference instead (`hr_…`, random, meaningless to Werk); Decode spends the token behind it,
 * once. A reference from another n8n process, an expired or a spent one is refused.
 */
interface Held {
	token: string;
	expiresAt: number;
}

const held = new Map<string, Held>();

function sweep(now: number): void {
	for (const [ref, entry] of held) if (entry.expiresAt <= now) held.delete(ref);
}

export function keep(token: string, expiresAt: string): string {
	const now = Date.now();
	sweep(now);
	const ref = `hr_${randomUUID().replace(/-/g, '')}`;
	const expires = Date.parse(expiresAt);
	held.set(ref, { token, expiresAt: Number.isNaN(expires) ? now + 15 * 60_000 : expires });
	return ref;
}

/** The token behind `ref`, removed: a second call for the same reference finds nothing. */
export function spend(ref: string): string | undefined {
	sweep(Date.now());
	const entry = held.get(ref);
	held.delete(ref);
	return entry?.token;
}
